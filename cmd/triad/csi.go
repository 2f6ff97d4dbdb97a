package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/triadhq/triad/internal/version"
	"github.com/triadhq/triad/sandbox/kube/csi"
)

// csiCmd is "triad csi-workdir": the CSI node plugin for kernel pods'
// working directories (sandbox/kube/csi), until SIGTERM.
func csiCmd(ctx context.Context, args []string) error {
	var node, kubelet, state string
	var maxSize int64
	fs := newFlagSet("csi-workdir")
	fs.str(&node, "node", "", "this node's Kubernetes name (required)")
	fs.str(&kubelet, "kubelet-dir", "/var/lib/kubelet", "the kubelet's --root-dir: its plugins/ and plugins_registry/ directories hold the plugin's sockets")
	fs.str(&state, "state", "/var/lib/triad-csi", "directory for the working directories' disk images")
	fs.bytes(&maxSize, "max-size", 64<<30, "largest working directory a pod may ask for, in bytes")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if len(fs.errs) > 0 {
		return fs.errs[0]
	}
	if node == "" {
		return fmt.Errorf("--node is required")
	}
	s, err := csi.New(csi.Config{
		Endpoint:     filepath.Join(kubelet, "plugins", csi.DriverName, "csi.sock"),
		Registration: filepath.Join(kubelet, "plugins_registry", csi.DriverName+"-reg.sock"),
		StateDir:     state, NodeID: node, MaxSize: maxSize, Version: version.String(),
		Logger: slog.New(slog.NewTextHandler(os.Stderr, nil)),
	})
	if err != nil {
		return err
	}
	return s.Serve(ctx)
}
