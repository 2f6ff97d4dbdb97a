package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/triadhq/triad/auth"
	"github.com/triadhq/triad/auth/keys"
)

const keysUsage = `Usage:
  triad keys create --name NAME [--tenant TENANT] [--scope runs,read,admin]
                          create a key and print it, once: only its hash is kept
  triad keys list         list the keys: id, name, tenant, scopes, created, last used
  triad keys revoke ID    revoke a key; every server sharing the store refuses it within seconds

Keys live in the store (--store and its flags, or their TRIAD_* twins), so
every server that shares it sees them. Scopes: read (read runs), runs (the
tools and recipes; includes read), admin (keys and every tenant).
`

// keysCmd is "triad keys": it works on the store directly, so the first key
// can be made before any server runs, and a revocation needs no server.
func keysCmd(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Print(keysUsage)
		return nil
	}
	sub, args := args[0], args[1:]
	var c config
	fs := newFlagSet("keys " + sub)
	var name, tenant, scope string
	if sub == "create" {
		fs.StringVar(&name, "name", "", "who or what uses the key (required)")
		fs.StringVar(&tenant, "tenant", auth.DefaultTenant, "the tenant whose runs the key sees and creates")
		fs.StringVar(&scope, "scope", "runs", "comma-separated scopes: read, runs, admin")
	}
	c.common(fs)
	if err := c.parse(fs, args); err != nil {
		return err
	}
	log := newLogger(&c)
	store, closeStore, err := openStore(ctx, &c, log)
	if err != nil {
		return err
	}
	defer closeStore()
	ks := keys.New(store.Meta(), keys.Config{Logger: log})
	switch sub {
	case "create":
		if name == "" {
			return fmt.Errorf("triad keys create needs --name NAME")
		}
		scopes, err := auth.ParseScopes(scope)
		if err != nil {
			return fmt.Errorf("--scope: %w", err)
		}
		tok, k, err := ks.Create(ctx, name, tenant, scopes)
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "created key %s (%s) for tenant %s with scopes %s; it is shown this once:\n", k.ID, k.Name, k.Tenant, strings.Join(k.Scopes, ","))
		fmt.Println(tok)
		return nil
	case "list":
		if fs.NArg() != 0 {
			return fmt.Errorf("triad keys list takes no arguments")
		}
		list, err := ks.List(ctx)
		if err != nil {
			return err
		}
		w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "ID\tNAME\tTENANT\tSCOPES\tCREATED\tLAST USED\tSTATUS")
		for _, k := range list {
			used, status := "never", "active"
			if k.LastUsed != nil {
				used = k.LastUsed.UTC().Format(time.RFC3339)
			}
			if k.Revoked != nil {
				status = "revoked " + k.Revoked.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.Name, k.Tenant, strings.Join(k.Scopes, ","), k.Created.UTC().Format(time.RFC3339), used, status)
		}
		return w.Flush()
	case "revoke":
		if fs.NArg() != 1 {
			return fmt.Errorf("triad keys revoke takes one key id (triad keys list shows them)")
		}
		k, err := ks.Revoke(ctx, fs.Arg(0))
		if err != nil {
			return err
		}
		fmt.Printf("revoked key %s (%s, tenant %s)\n", k.ID, k.Name, k.Tenant)
		return nil
	}
	return fmt.Errorf("triad keys: unknown subcommand %q\n\n%s", sub, keysUsage)
}
