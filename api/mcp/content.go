package mcp

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"slices"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/triadhq/triad/wire"
)

// inlineImage are the image types sent as image content: the raster types
// MCP clients display. SVG stays a reference (path and sha256) because
// clients that pass images to a model generally cannot take it.
var inlineImages = []string{"image/png", "image/jpeg", "image/gif", "image/webp"}

// images returns a cell's images as image content, in output order
// (display outputs, then the result). The orchestrator stored each image as
// a run file and left an ImageRef in the bundle; the bytes are read back by
// digest, through the store's verifying reader. An image that cannot be
// inlined is described in a text block instead, so the agent knows where it
// is.
func (s *Server) images(ctx context.Context, out wire.ExecResponse) []sdk.Content {
	bundles := out.Display
	if out.Result != nil {
		bundles = append(bundles[:len(bundles):len(bundles)], *out.Result)
	}
	var cs []sdk.Content
	for _, b := range bundles {
		for _, mime := range inlineImages {
			ref, ok := b.Data[mime].(wire.FileRef)
			if !ok {
				continue
			}
			data, err := s.readImage(ctx, ref)
			if err != nil {
				s.log.WarnContext(ctx, "image not inlined", "path", ref.Path, "err", err)
				cs = append(cs, &sdk.TextContent{Text: fmt.Sprintf("(image %s, %d bytes, sha256 %s, is not inlined: %v; read it with tmp_read)", ref.Path, ref.Size, ref.SHA256, err)})
				continue
			}
			cs = append(cs, &sdk.ImageContent{Data: data, MIMEType: mime})
		}
	}
	return cs
}

func (s *Server) readImage(ctx context.Context, ref wire.FileRef) ([]byte, error) {
	if ref.Size > s.maxImage {
		return nil, fmt.Errorf("it is over the %d-byte inline limit", s.maxImage)
	}
	r, err := s.orch.Store().OpenBlob(ctx, ref.SHA256)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	// The reader checks the bytes against the digest as they are read;
	// reading to EOF is what makes that check happen.
	data, err := io.ReadAll(io.LimitReader(r, s.maxImage+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > s.maxImage {
		return nil, fmt.Errorf("it is over the %d-byte inline limit", s.maxImage)
	}
	return data, nil
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
