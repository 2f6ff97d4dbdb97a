package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strings"
	"sync"

	"github.com/gorilla/mux"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/wire"
)

func (s *Server) sandboxRestart(w http.ResponseWriter, r *http.Request) error {
	id, err := run(r)
	if err != nil {
		return err
	}
	if err := s.orch.Restart(r.Context(), id); err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, wire.RestartResponse{OK: true, Kernel: wire.RestartKernel{Restarted: true}})
}

// sandboxExec is POST /sandbox/exec. With Accept: text/event-stream the
// cell's output streams as Server-Sent Events while it runs, one event per
// piece (stdout, stderr, display, result, clear; data is a wire.ExecEvent),
// and the stream ends with a "done" event whose data is exactly the answer
// the plain call returns, or an "error" event with the error body. Both are
// the same orchestrated call.
func (s *Server) sandboxExec(w http.ResponseWriter, r *http.Request) error {
	if !acceptsEventStream(r) {
		return jsonTool(s, func(ctx context.Context, id runid.ID, in wire.ExecRequest) (wire.ExecResponse, error) {
			return s.orch.Exec(ctx, id, in)
		})(w, r)
	}
	id, err := run(r)
	if err != nil {
		return err
	}
	var in wire.ExecRequest
	if err := s.decode(w, r, &in); err != nil {
		return err
	}
	sse, err := newEventStream(w)
	if err != nil {
		return err
	}
	out, err := s.orch.ExecStream(r.Context(), id, in, func(e orchestrator.ExecEvent) {
		sse.send(e.Type, e.ExecEvent)
	})
	if err != nil {
		body, _ := s.logError(r, err, 0)
		sse.send("error", body)
		return nil
	}
	sse.send("done", out)
	return nil
}

// acceptsEventStream reports whether the client asked for Server-Sent
// Events.
func acceptsEventStream(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		for _, part := range strings.Split(v, ",") {
			mt, _, _ := mime.ParseMediaType(strings.TrimSpace(part))
			if mt == "text/event-stream" {
				return true
			}
		}
	}
	return false
}

// eventStream writes Server-Sent Events, flushing each.
type eventStream struct {
	mu sync.Mutex
	w  http.ResponseWriter
	fl http.Flusher
}

func newEventStream(w http.ResponseWriter) (*eventStream, error) {
	fl, ok := w.(http.Flusher)
	if !ok {
		return nil, errors.New("streaming unsupported by the connection")
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	fl.Flush()
	return &eventStream{w: w, fl: fl}, nil
}

// send writes one event; data is JSON on one line.
func (e *eventStream) send(event string, v any) {
	b, _ := json.Marshal(v)
	e.mu.Lock()
	defer e.mu.Unlock()
	fmt.Fprintf(e.w, "event: %s\ndata: %s\n\n", event, b)
	e.fl.Flush()
}

// sendID writes one event with an id, which a reconnecting EventSource
// sends back as Last-Event-ID.
func (e *eventStream) sendID(event, id string, v any) {
	b, _ := json.Marshal(v)
	e.mu.Lock()
	defer e.mu.Unlock()
	fmt.Fprintf(e.w, "id: %s\nevent: %s\ndata: %s\n\n", id, event, b)
	e.fl.Flush()
}

// comment writes an SSE comment (a keep-alive).
func (e *eventStream) comment(text string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	fmt.Fprintf(e.w, ": %s\n\n", text)
	e.fl.Flush()
}

// kernelsList is GET /kernels.
func (s *Server) kernelsList(w http.ResponseWriter, r *http.Request) error {
	out, err := s.orch.Kernels(r.Context())
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, out)
}

// kernelAction is an action on the live kernel of the run the path
// names (POST /kernels/{id}/interrupt and restart, DELETE /kernels/{id}).
func (s *Server) kernelAction(action string) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		id, err := runid.Parse(mux.Vars(r)["id"])
		if err != nil {
			return err
		}
		out, err := s.orch.KernelAction(r.Context(), id, action)
		if err != nil {
			return err
		}
		return writeJSON(w, http.StatusOK, out)
	}
}
