package mcp

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"slices"
	"sync"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/triadhq/triad/orchestrator"
	"github.com/triadhq/triad/tmpfs"
	"github.com/triadhq/triad/wire"
)

// inlineImage are the image types sent as image content: the raster types
// MCP clients display. SVG stays a reference (path and sha256) because
// clients that pass images to a model generally cannot take it.
var inlineImages = []string{"image/png", "image/jpeg", "image/gif", "image/webp"}

// shown collects the images a cell shows, as its answer's bundles will
// hold them (displays after the last clear, then the result): the bytes
// the kernel sent, decoded, which are the bytes the orchestrator hashed and
// stored, so the answer's images are inlined without reading them back.
type shown struct {
	mu      sync.Mutex
	display []map[string][]byte
	result  map[string][]byte
}

func (sh *shown) add(e orchestrator.ExecEvent) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	switch e.Type {
	case wire.EventDisplay:
		sh.display = append(sh.display, e.Images)
	case wire.EventClear:
		sh.display = nil
	case wire.EventResult:
		sh.result = e.Images
	}
}

// images returns a cell's images as image content, in output order
// (display outputs, then the result). The orchestrator stored each image as
// a run file and left a file reference in the bundle; the bytes are the
// ones the cell showed (shown). An image that cannot be inlined is
// described in a text block instead, so the agent knows where it is.
func (s *Server) images(out wire.ExecResponse, sh *shown) []sdk.Content {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	type shownBundle struct {
		b   wire.Bundle
		img map[string][]byte
	}
	var bundles []shownBundle
	for i, b := range out.Display {
		var img map[string][]byte
		if i < len(sh.display) {
			img = sh.display[i]
		}
		bundles = append(bundles, shownBundle{b, img})
	}
	if out.Result != nil {
		bundles = append(bundles, shownBundle{*out.Result, sh.result})
	}
	var cs []sdk.Content
	for _, b := range bundles {
		for _, mime := range inlineImages {
			ref, ok := b.b.Data[mime].(wire.FileRef)
			if !ok {
				continue
			}
			data, ok := b.img[mime]
			switch {
			case !ok || tmpfs.DigestOf(data) != ref.SHA256:
				cs = append(cs, &sdk.TextContent{Text: fmt.Sprintf("(image %s, %d bytes, sha256 %s, is not inlined; read it with tmp_read)", ref.Path, ref.Size, ref.SHA256)})
			case int64(len(data)) > s.maxImage:
				cs = append(cs, &sdk.TextContent{Text: fmt.Sprintf("(image %s, %d bytes, sha256 %s, is not inlined: it is over the %d-byte inline limit; read it with tmp_read)", ref.Path, ref.Size, ref.SHA256, s.maxImage)})
			default:
				cs = append(cs, &sdk.ImageContent{Data: data, MIMEType: mime})
			}
		}
	}
	return cs
}

// imageOf returns a binary file read with tmp_read as image content when
// its bytes are an image a client can show.
func imageOf(out wire.ReadResponse) *sdk.ImageContent {
	if out.BytesB64 == nil {
		return nil
	}
	data, err := base64.StdEncoding.DecodeString(*out.BytesB64)
	if err != nil {
		return nil
	}
	mime := http.DetectContentType(data)
	if !slices.Contains(inlineImages, mime) {
		return nil
	}
	return &sdk.ImageContent{Data: data, MIMEType: mime}
}
