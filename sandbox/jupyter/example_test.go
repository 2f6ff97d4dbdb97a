package jupyter_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/triadhq/triad/sandbox/jupyter"
)

// Example shows the sandbox/docker flow: the kernel sees its socket
// directory at /run/kernel, bind-mounted from /tmp/triad-0/ab12cd on the host.
// It needs a running kernel, so it is compiled but not run.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	info := jupyter.NewConnInfo("/run/kernel/k")
	b, _ := json.Marshal(info)
	_ = os.WriteFile("/tmp/triad-0/ab12cd/conn.json", b, 0o600)
	// … start `python3 -m ipykernel_launcher -f /run/kernel/conn.json` in the container …

	c, err := jupyter.Dial(ctx, info, "/tmp/triad-0/ab12cd/k", jupyter.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	if err := c.WaitReady(ctx); err != nil {
		fmt.Println(err)
		return
	}

	ex, err := c.Execute(ctx, "x = 21\nx*2", jupyter.ExecOptions{})
	if err != nil {
		fmt.Println(err) // errors.Is(err, jupyter.ErrKernelDead): start a new kernel
		return
	}
	cell, cancelCell := context.WithTimeout(ctx, 2*time.Second)
	defer cancelCell()
	out, err := ex.Wait(cell)
	if errors.Is(err, context.DeadlineExceeded) {
		// The cell overran: interrupt it, keep the state, collect the rest.
		_ = c.Interrupt(ctx)
		out, err = ex.Wait(ctx)
	}
	if err != nil {
		fmt.Println(err)
		return
	}
	if out.Result != nil {
		v, _ := out.Result.Text("text/plain")
		fmt.Println(v)
	}
}
