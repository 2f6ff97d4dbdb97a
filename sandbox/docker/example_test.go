package docker_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/docker/docker/client"

	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/docker"
	"github.com/triadhq/triad/sandbox/image"
)

// Example starts a jailed kernel and runs two cells that share state. It
// has no Output section because it needs a Docker engine (and root to build
// the image on first use); the package's tests run the same steps against
// the real engine.
func Example() {
	ctx := context.Background()
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	tag, err := image.Ensure(ctx, cli, image.Options{Progress: os.Stderr}) // builds or imports triad-sandbox:<hash>
	if err != nil {
		log.Fatal(err)
	}
	b, err := docker.New(ctx, docker.Config{Image: tag, WorkRoot: "/var/lib/triad/work"})
	if err != nil {
		log.Fatal(err) // errors.Is(err, sandbox.ErrUnavailable) when no engine answers
	}
	defer b.Close()

	k, err := b.Start(ctx, sandbox.Spec{Owner: "run-1", Limits: sandbox.Limits{DiskBytes: 512 << 20}})
	if err != nil {
		log.Fatal(err)
	}
	defer k.Close()
	if _, err := k.Execute(ctx, sandbox.Cell{Code: "x = 21", Timeout: 10 * time.Second}); err != nil {
		log.Fatal(err)
	}
	var out sandbox.Collector // or any func(sandbox.Event), called as output arrives
	res, err := k.Execute(ctx, sandbox.Cell{Code: "x * 2", Timeout: 10 * time.Second, Output: out.Add})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.OK, string(out.Value.Data["text/plain"])) // true "42"
}
