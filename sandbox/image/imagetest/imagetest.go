// Package imagetest gives tests the real sandbox image, built or imported
// once per test binary as CI does.
package imagetest

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/client"

	"github.com/triadhq/triad/internal/testenv"
	"github.com/triadhq/triad/sandbox/image"
)

var (
	once      sync.Once
	tag       string
	imageErr  error
	engineErr error
)

// Tag returns the sandbox image's tag, importing or building it on first
// use (image.Ensure). A missing engine or image skips the test locally and
// fails it under CI (testenv.Missing).
func Tag(t testing.TB) string {
	t.Helper()
	once.Do(func() {
		cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
		if err != nil {
			engineErr = err
			return
		}
		defer cli.Close()
		pctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err = cli.Ping(pctx)
		cancel()
		if err != nil {
			engineErr = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
		defer cancel()
		tag, imageErr = image.Ensure(ctx, cli, image.Options{Progress: os.Stderr})
	})
	if engineErr != nil {
		testenv.Missing(t, "a Docker engine (dockerd): "+engineErr.Error())
	}
	if imageErr != nil {
		testenv.Missing(t, "the sandbox image (root + debootstrap to build it): "+imageErr.Error())
	}
	return tag
}
