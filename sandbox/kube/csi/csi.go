// Package csi is a CSI node plugin that gives each Kubernetes kernel pod a working directory of a fixed size, enforced when a write is made.
//
// A kernel pod names the driver (DriverName) in an inline ephemeral
// volume with its size and owner as attributes; the plugin makes a sparse
// ext4 image of that size and loop-mounts it where the kubelet asks
// (sandbox/internal/loopfs), and removes both when the pod goes. A cell
// writing past the size gets ENOSPC, as on Docker. Without it a pod's
// emptyDir has only a sizeLimit, which the kubelet enforces by evicting
// the pod once it has noticed, after the bytes are on the node's disk:
// one run could fill the node and put every tenant's new kernels behind
// its DiskPressure taint (docs/DECISIONS.md, "The kube working directory's
// quota").
//
// The plugin registers itself with the kubelet through the plugin
// registration socket (the node-driver-registrar's job, done here, so the
// plugin is one process). It runs as root on every node: scripts/kube.sh
// starts it beside the kubelet, and deploy/kubernetes/README.md says how to
// run it on other clusters ("The nodes").
package csi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/triadhq/triad/internal/keyedmutex"
	"github.com/triadhq/triad/sandbox/internal/loopfs"
)

// DriverName is the CSI driver's name, as pods and the CSIDriver object
// name it.
const DriverName = "workdir.triad.dev"

// Volume attributes a pod gives the driver.
const (
	// AttrSize is the working directory's size in bytes.
	AttrSize = "size"
	// AttrUID and AttrGID own its root directory: the kernel's uid and gid.
	AttrUID = "uid"
	AttrGID = "gid"
	// attrEphemeral is set by the kubelet on an inline volume.
	attrEphemeral = "csi.storage.k8s.io/ephemeral"
)

// Config configures a Server.
type Config struct {
	// Endpoint is the unix socket the kubelet's CSI client dials:
	// <kubelet root>/plugins/<DriverName>/csi.sock.
	Endpoint string
	// Registration is the registration socket the kubelet watches for:
	// <kubelet root>/plugins_registry/<DriverName>-reg.sock.
	Registration string
	// StateDir holds the disk images.
	StateDir string
	// NodeID names the node (its Kubernetes name).
	NodeID string
	// MaxSize refuses volumes larger than this many bytes; zero means
	// 64 GiB.
	MaxSize int64
	// Version is reported to the kubelet.
	Version string
	Logger  *slog.Logger
}

// Server serves the CSI identity and node services and the kubelet's
// plugin registration. It is safe for concurrent use: per-volume locks
// serialize publishing and unpublishing one volume.
type Server struct {
	csipb.UnimplementedIdentityServer
	csipb.UnimplementedNodeServer
	registerapi.UnimplementedRegistrationServer

	cfg   Config
	log   *slog.Logger
	locks keyedmutex.Map[string]
}

var (
	_ csipb.IdentityServer           = (*Server)(nil)
	_ csipb.NodeServer               = (*Server)(nil)
	_ registerapi.RegistrationServer = (*Server)(nil)
)

// New checks the configuration and that this process can make loop-mounted
// images.
func New(cfg Config) (*Server, error) {
	if cfg.Endpoint == "" || cfg.Registration == "" || cfg.StateDir == "" || cfg.NodeID == "" {
		return nil, errors.New("csi: Endpoint, Registration, StateDir and NodeID are required")
	}
	if cfg.MaxSize == 0 {
		cfg.MaxSize = 64 << 30
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if err := loopfs.Probe(); err != nil {
		return nil, fmt.Errorf("csi: %w", err)
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, err
	}
	return &Server{cfg: cfg, log: cfg.Logger}, nil
}

// Serve listens on both sockets until ctx ends.
func (s *Server) Serve(ctx context.Context) error {
	csiSrv, regSrv := grpc.NewServer(), grpc.NewServer()
	csipb.RegisterIdentityServer(csiSrv, s)
	csipb.RegisterNodeServer(csiSrv, s)
	registerapi.RegisterRegistrationServer(regSrv, s)
	var lns []net.Listener
	for _, p := range []string{s.cfg.Endpoint, s.cfg.Registration} {
		if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
			return err
		}
		_ = os.Remove(p) // a socket an earlier process left
		ln, err := net.Listen("unix", p)
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			return err
		}
		lns = append(lns, ln)
	}
	errc := make(chan error, 2)
	go func() { errc <- csiSrv.Serve(lns[0]) }()
	go func() { errc <- regSrv.Serve(lns[1]) }()
	s.log.InfoContext(ctx, "CSI node plugin serving", "driver", DriverName, "endpoint", s.cfg.Endpoint, "registration", s.cfg.Registration)
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	regSrv.Stop() // the kubelet sees the plugin go first
	csiSrv.GracefulStop()
	_ = os.Remove(s.cfg.Registration)
	_ = os.Remove(s.cfg.Endpoint)
	return err
}

// GetInfo implements the kubelet's plugin registration.
func (s *Server) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{Type: registerapi.CSIPlugin, Name: DriverName, Endpoint: s.cfg.Endpoint, SupportedVersions: []string{"1.0.0"}}, nil
}

// NotifyRegistrationStatus implements the kubelet's plugin registration.
func (s *Server) NotifyRegistrationStatus(ctx context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if !st.PluginRegistered {
		s.log.ErrorContext(ctx, "the kubelet refused the CSI plugin's registration", "error", st.Error)
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// GetPluginInfo implements csi.IdentityServer.
func (s *Server) GetPluginInfo(context.Context, *csipb.GetPluginInfoRequest) (*csipb.GetPluginInfoResponse, error) {
	return &csipb.GetPluginInfoResponse{Name: DriverName, VendorVersion: s.cfg.Version}, nil
}

// GetPluginCapabilities implements csi.IdentityServer: a node plugin only,
// with no controller service.
func (s *Server) GetPluginCapabilities(context.Context, *csipb.GetPluginCapabilitiesRequest) (*csipb.GetPluginCapabilitiesResponse, error) {
	return &csipb.GetPluginCapabilitiesResponse{}, nil
}

// Probe implements csi.IdentityServer.
func (s *Server) Probe(context.Context, *csipb.ProbeRequest) (*csipb.ProbeResponse, error) {
	return &csipb.ProbeResponse{}, nil
}

// NodeGetInfo implements csi.NodeServer.
func (s *Server) NodeGetInfo(context.Context, *csipb.NodeGetInfoRequest) (*csipb.NodeGetInfoResponse, error) {
	return &csipb.NodeGetInfoResponse{NodeId: s.cfg.NodeID}, nil
}

// NodeGetCapabilities implements csi.NodeServer: no staging, no stats.
func (s *Server) NodeGetCapabilities(context.Context, *csipb.NodeGetCapabilitiesRequest) (*csipb.NodeGetCapabilitiesResponse, error) {
	return &csipb.NodeGetCapabilitiesResponse{}, nil
}

// volumeID is what the kubelet names an inline volume ("csi-" and a hash);
// anything else could walk out of StateDir.
var volumeID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

func (s *Server) image(id string) string { return filepath.Join(s.cfg.StateDir, id+".ext4") }

// NodePublishVolume implements csi.NodeServer: a fresh image of the
// volume's size, owned by its uid and gid, mounted at the target. Publishing
// a volume that is mounted already succeeds (the kubelet retries).
func (s *Server) NodePublishVolume(ctx context.Context, req *csipb.NodePublishVolumeRequest) (*csipb.NodePublishVolumeResponse, error) {
	id, target, attrs := req.GetVolumeId(), req.GetTargetPath(), req.GetVolumeContext()
	if !volumeID.MatchString(id) || !filepath.IsAbs(target) {
		return nil, status.Errorf(codes.InvalidArgument, "volume id %q or target %q is not valid", id, target)
	}
	if attrs[attrEphemeral] != "true" {
		return nil, status.Error(codes.InvalidArgument, DriverName+" serves inline ephemeral volumes only")
	}
	if req.GetReadonly() {
		return nil, status.Error(codes.InvalidArgument, "a working directory is not read-only")
	}
	size, err := strconv.ParseInt(attrs[AttrSize], 10, 64)
	if err != nil || size < 1<<20 || size > s.cfg.MaxSize {
		return nil, status.Errorf(codes.InvalidArgument, "attribute %s %q: want bytes from 1 MiB to %d", AttrSize, attrs[AttrSize], s.cfg.MaxSize)
	}
	uid, uerr := strconv.Atoi(attrs[AttrUID])
	gid, gerr := strconv.Atoi(attrs[AttrGID])
	if uerr != nil || gerr != nil || uid < 0 || gid < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "attributes %s and %s: want the owner's numeric uid and gid", AttrUID, AttrGID)
	}
	defer s.locks.Lock(id)()
	if ok, err := loopfs.Mounted(target); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	} else if ok {
		return &csipb.NodePublishVolumeResponse{}, nil
	}
	if err := os.MkdirAll(target, 0o750); err != nil {
		return nil, status.Errorf(codes.Internal, "create target: %v", err)
	}
	img := s.image(id)
	_ = os.Remove(img) // from an attempt that failed before it mounted
	if err := loopfs.Make(ctx, img, size, uid, gid); err != nil {
		_ = os.Remove(img)
		return nil, status.Error(codes.Internal, err.Error())
	}
	if err := loopfs.Mount(ctx, img, target); err != nil {
		_ = loopfs.UnmountAll(target)
		_ = os.Remove(img)
		return nil, status.Error(codes.Internal, err.Error())
	}
	s.log.InfoContext(ctx, "working directory published", "volume", id, "bytes", size, "pod", attrs["csi.storage.k8s.io/pod.name"])
	return &csipb.NodePublishVolumeResponse{}, nil
}

// NodeUnpublishVolume implements csi.NodeServer: the mount and the image
// go. Unpublishing what is gone already succeeds.
func (s *Server) NodeUnpublishVolume(ctx context.Context, req *csipb.NodeUnpublishVolumeRequest) (*csipb.NodeUnpublishVolumeResponse, error) {
	id, target := req.GetVolumeId(), req.GetTargetPath()
	if !volumeID.MatchString(id) || !filepath.IsAbs(target) {
		return nil, status.Errorf(codes.InvalidArgument, "volume id %q or target %q is not valid", id, target)
	}
	defer s.locks.Lock(id)()
	if err := loopfs.UnmountAll(target); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, status.Errorf(codes.Internal, "remove target: %v", err)
	}
	if err := os.Remove(s.image(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, status.Errorf(codes.Internal, "remove image: %v", err)
	}
	s.log.InfoContext(ctx, "working directory unpublished", "volume", id)
	return &csipb.NodeUnpublishVolumeResponse{}, nil
}
