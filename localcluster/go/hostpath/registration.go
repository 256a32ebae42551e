// Self-registration with the kubelet, in place of node-driver-registrar: the kubelet's
// plugin watcher finds <kubelet-dir>/plugins_registry/<driver>-reg.sock, asks GetInfo for the
// driver's name and CSI endpoint, calls NodeGetInfo there (CSINode, the node's annotation and
// topology labels), and reports the outcome with NotifyRegistrationStatus.
package main

import (
	"context"
	"log"
	"os"
	"path/filepath"

	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

type registrar struct {
	registerapi.UnimplementedRegistrationServer
	name, endpoint string
}

func (r *registrar) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              r.name,
		Endpoint:          r.endpoint,
		SupportedVersions: []string{"1.0.0"},
	}, nil
}

func (r *registrar) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if s.GetPluginRegistered() {
		log.Printf("registration: the kubelet registered %s", r.name)
	} else {
		log.Printf("registration: the kubelet refused %s: %s", r.name, s.GetError())
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

func registrationSocket(cfg config) string {
	return filepath.Join(cfg.kubeletDir, "plugins_registry", cfg.driverName+"-reg.sock")
}

// register serves the Registration service until the returned server is stopped.
func register(cfg config, endpoint string) (*grpc.Server, error) {
	path := registrationSocket(cfg)
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, err
	}
	lis, err := listen(path)
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(logErrors))
	registerapi.RegisterRegistrationServer(srv, &registrar{name: cfg.driverName, endpoint: endpoint})
	go func() {
		if err := srv.Serve(lis); err != nil {
			log.Printf("registration: %v", err)
		}
	}()
	log.Printf("registration: serving on %s (endpoint %s)", path, endpoint)
	return srv, nil
}
