package main

import "testing"

func TestLimitsOf(t *testing.T) {
	for _, c := range []struct {
		params map[string]string
		want   limits
		bad    bool
	}{
		{map[string]string{"iops": "3000", "throughput": "125"}, limits{125 * mib, 3000}, false},
		{map[string]string{"iops": "6000", "throughput": "290Mi"}, limits{290 * mib, 6000}, false},
		{map[string]string{"throughput": "62.5"}, limits{62.5 * mib, 0}, false},
		{map[string]string{"tier": "gold"}, limits{}, false},
		{map[string]string{"throughput": "fast"}, limits{}, true},
		{map[string]string{"throughput": "0"}, limits{}, true},
		{map[string]string{"iops": "-1"}, limits{}, true},
		{map[string]string{"iops": "1.5"}, limits{}, true},
	} {
		got, err := limitsOf(c.params)
		if (err != nil) != c.bad || (!c.bad && got != c.want) {
			t.Errorf("limitsOf(%v) = %v, %v; want %v (error: %v)", c.params, got, err, c.want, c.bad)
		}
	}
}

func TestLimitsString(t *testing.T) {
	if s := (limits{250 * mib, 6000}).String(); s != "250 MiB/s, 6000 IOPS" {
		t.Errorf("got %q", s)
	}
	if s := (limits{}).String(); s != "no limit" {
		t.Errorf("got %q", s)
	}
}

func TestUnescapeMount(t *testing.T) {
	if got := unescapeMount(`/a\040b\134c`); got != `/a b\c` {
		t.Errorf("got %q", got)
	}
}
