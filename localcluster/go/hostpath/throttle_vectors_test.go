package main

// The block throttle's one specification, localcluster/throttle_vectors.json, checked on the
// driver's side: a class's parameters become the table's limits (limitsOf), and the limits
// are written into the cgroup as the table says (throttler.write, v1 and v2). The sandbox's
// emulation checks the same table in Python (tests/localcluster/test_throttle_vectors.py).

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

type vectors struct {
	ClassParameters []struct {
		Parameters map[string]string `json:"parameters"`
		Bps        *int64            `json:"bps"`
		Iops       *int64            `json:"iops"`
		Error      bool              `json:"error"`
		NoLimit    bool              `json:"no_limit"`
		Why        string            `json:"why"`
	} `json:"class_parameters"`
	Written []struct {
		Device string            `json:"device"`
		Bps    *int64            `json:"bps"`
		Iops   *int64            `json:"iops"`
		IoMax  string            `json:"io.max"`
		Blkio  map[string]string `json:"blkio"`
		Why    string            `json:"why"`
	} `json:"written"`
}

func loadVectors(t *testing.T) vectors {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "throttle_vectors.json"))
	if err != nil {
		t.Fatal(err)
	}
	var v vectors
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatalf("throttle_vectors.json: %v", err)
	}
	if len(v.ClassParameters) == 0 || len(v.Written) == 0 {
		t.Fatal("throttle_vectors.json: no vectors")
	}
	return v
}

// orNone is the driver's "no limit of that kind": 0.
func orNone(n *int64) int64 {
	if n == nil {
		return 0
	}
	return *n
}

func TestClassParametersFollowTheVectors(t *testing.T) {
	for _, c := range loadVectors(t).ClassParameters {
		got, err := limitsOf(c.Parameters)
		switch {
		case c.Error:
			if err == nil {
				t.Errorf("limitsOf(%q) = %v; want an error (%s)", c.Parameters, got, c.Why)
			}
		case c.NoLimit:
			// No figure, nothing to throttle: the volume is left as it is.
			if err != nil || got != (limits{}) {
				t.Errorf("limitsOf(%q) = %v, %v; want no limit (%s)", c.Parameters, got, err, c.Why)
			}
		default:
			want := limits{bps: orNone(c.Bps), iops: orNone(c.Iops)}
			if err != nil || got != want {
				t.Errorf("limitsOf(%q) = %v, %v; want %v (%s)", c.Parameters, got, err, want, c.Why)
			}
		}
	}
}

func TestWrittenLimitsFollowTheVectors(t *testing.T) {
	for _, c := range loadVectors(t).Written {
		l := limits{bps: orNone(c.Bps), iops: orNone(c.Iops)}
		expect := map[int]map[string]string{2: {"io.max": c.IoMax}, 1: c.Blkio}
		for version, files := range expect {
			// The cgroup's files exist before a write, as the kernel makes them.
			dir := t.TempDir()
			for name := range files {
				if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			th := &throttler{h: hierarchy{version: version, mount: dir}}
			if err := th.write(dir, c.Device, l); err != nil {
				t.Fatalf("v%d write %v: %v", version, l, err)
			}
			for name, want := range files {
				got, err := os.ReadFile(filepath.Join(dir, name))
				if err != nil {
					t.Fatal(err)
				}
				if string(got) != want {
					t.Errorf("v%d %s for %v (%s) = %q; want %q", version, name, l, c.Why, got, want)
				}
			}
		}
	}
}
