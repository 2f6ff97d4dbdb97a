package wasm_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/triadhq/triad/sandbox"
	"github.com/triadhq/triad/sandbox/wasm"
)

// A kernel keeps its variables from one cell to the next, and a cell's last
// expression comes back as its value, as in Jupyter.
func Example() {
	ctx := context.Background()
	cache, _ := os.UserCacheDir()
	b, err := wasm.New(ctx, wasm.Config{CacheDir: filepath.Join(cache, "triad", "wazero")})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()
	k, err := b.Start(ctx, sandbox.Spec{Owner: "example-run"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer k.Close()

	for _, code := range []string{"x = 21", "print('hello from', __import__('sys').platform)", "x * 2", "1/0"} {
		var out sandbox.Collector // or any func(sandbox.Event), called as output arrives
		res, err := k.Execute(ctx, sandbox.Cell{Code: code, Timeout: 10 * time.Second, Output: out.Add})
		if err != nil {
			fmt.Println(err)
			return
		}
		switch {
		case res.Error != nil:
			fmt.Printf("[%d] %s: %s\n", res.ExecutionCount, res.Error.Ename, res.Error.Evalue)
		case out.Value != nil:
			fmt.Printf("[%d] %s\n", res.ExecutionCount, out.Value.Data["text/plain"])
		default:
			fmt.Printf("[%d] stdout %q\n", res.ExecutionCount, out.Stdout.String())
		}
	}
	// Output:
	// [1] stdout ""
	// [2] stdout "hello from wasi\n"
	// [3] "42"
	// [4] ZeroDivisionError: division by zero
}
