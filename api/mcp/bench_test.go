package mcp

import (
	"fmt"
	"strings"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/triadhq/triad/internal/runid"
	"github.com/triadhq/triad/wire"
)

// BenchmarkWrite measures what the MCP layer adds to a call: the same
// tmp.write of a 1 KiB text file (journal and trace included) made on the
// orchestrator directly (the baseline), over MCP on stdio pipes and over MCP
// on streamable HTTP. Read the MCP cases as ratios of the baseline's ns/op
// from the same run.
func BenchmarkWrite(b *testing.B) {
	body := strings.Repeat("x", 1024)
	b.Run("orchestrator", func(b *testing.B) {
		s := newStack(b, stackOptions{})
		for i := 0; b.Loop(); i++ {
			in := wire.WriteRequest{Path: fmt.Sprintf("f/%d.txt", i), Text: &body}
			if _, err := s.orch.Write(b.Context(), runid.Must("bench-direct"), in); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, tr := range transports {
		b.Run("mcp-"+tr.name, func(b *testing.B) {
			s := newStack(b, stackOptions{})
			cs := tr.connect(b, s)
			for i := 0; b.Loop(); i++ {
				res, err := cs.CallTool(b.Context(), &sdk.CallToolParams{Name: ToolWrite, Arguments: map[string]any{"path": fmt.Sprintf("f/%d.txt", i), "text": body}})
				if err != nil || res.IsError {
					b.Fatalf("tmp_write: %v %v", err, res)
				}
			}
		})
	}
}
