package kube

import (
	"context"
	"log/slog"
	"sync"

	"k8s.io/klog/v2"
)

// routeKlog sends client-go's own log lines (klog: "Unhandled Error" from
// an exec or port-forward stream's copy loop when Triad closes it, the
// websocket's failed pings) to the first Backend's logger at debug level,
// instead of klog's default of stderr. They are the normal end of a
// stream Triad closed, and on stderr they buried test failures under
// thousands of lines. klog's logger is process-wide, so the first New
// sets it. See docs/DECISIONS.md, "client-go's log lines".
func routeKlog(log *slog.Logger) {
	klogOnce.Do(func() { klog.SetSlogLogger(slog.New(debugHandler{log.Handler()})) })
}

var klogOnce sync.Once

// debugHandler logs every record at debug level.
type debugHandler struct{ h slog.Handler }

func (d debugHandler) Enabled(ctx context.Context, _ slog.Level) bool {
	return d.h.Enabled(ctx, slog.LevelDebug)
}

func (d debugHandler) Handle(ctx context.Context, r slog.Record) error {
	r.Level = slog.LevelDebug
	r.AddAttrs(slog.String("from", "client-go"))
	return d.h.Handle(ctx, r)
}

func (d debugHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return debugHandler{d.h.WithAttrs(as)}
}

func (d debugHandler) WithGroup(name string) slog.Handler {
	return debugHandler{d.h.WithGroup(name)}
}
