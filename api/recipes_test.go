package api_test

import (
	"bytes"
	"mime/multipart"
	"strings"
	"testing"
	"time"

	"github.com/triadhq/triad/api"
	"github.com/triadhq/triad/orchestrator/orchestratortest"
	"github.com/triadhq/triad/recipes"
	"github.com/triadhq/triad/recipes/runner"
	"github.com/triadhq/triad/recipes/sampledata"
	"github.com/triadhq/triad/wire"
)

// form builds POST /run's multipart body: the request as JSON and each
// file in a part named input:<name>.
func form(t *testing.T, request string, files map[string][]byte) (*bytes.Buffer, string) {
	t.Helper()
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	if err := mw.WriteField("request", request); err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		w, err := mw.CreateFormFile("input:"+name, name+".bin")
		if err != nil {
			t.Fatal(err)
		}
		w.Write(data)
	}
	mw.Close()
	return &b, mw.FormDataContentType()
}

// A recipe launched with an uploaded input file runs: the file arrives
// with POST /run (multipart), so the run is set up from it before its
// first call. Uploading it first with a tool call, as the console once
// did, fixes the run's setup at the default; POST /run then refuses the
// run, and says how to send the file instead. A refused launch leaves no
// run behind.
func TestRecipeWithUploadedInput(t *testing.T) {
	s := orchestratortest.New(t, orchestratortest.Options{Sandbox: "wasm", Search: true})
	cat, err := recipes.NewCatalog()
	if err != nil {
		t.Fatal(err)
	}
	rn := runner.New(runner.Config{Orchestrator: s.Orch, Catalog: cat, Backend: s.Backend})
	t.Cleanup(func() { rn.Close() })
	c := apiServer(t, api.Config{Orchestrator: s.Orch, Runner: rn})

	sample, err := sampledata.Read("competitor_snapshot_prev.json")
	if err != nil {
		t.Fatal(err)
	}
	// Another snapshot than the bundled one: its date decides the run's
	// as_of, and its bytes the run's seed.
	mine := bytes.Replace(sample, []byte(`"taken_at": "2026-10-25"`), []byte(`"taken_at": "2026-10-30"`), 1)
	if bytes.Equal(mine, sample) {
		t.Fatal("the sample snapshot has no taken_at to change")
	}

	// The old way: mint a run, upload with a tool call, then start.
	var nr wire.NewRunResponse
	c.post("/runs", "", map[string]any{}).json(t, &nr)
	if a := c.do("PUT", "/tmp/files/data/competitor_snapshot_prev.json", nr.RunID, bytes.NewReader(mine)); a.status != 200 {
		t.Fatalf("upload: %d %s", a.status, a.body)
	}
	a := c.post("/run", "", map[string]any{"recipe": "competitor-alert", "run_id": nr.RunID})
	if a.status != 409 || a.errKind(t) != "conflict" || !strings.Contains(string(a.body), "multipart/form-data") {
		t.Errorf("a recipe on a run whose file was uploaded by a tool call: got %d %s, want 409 saying to send the file with POST /run", a.status, a.body)
	}

	// The new way: one request.
	body, ct := form(t, `{"recipe": "competitor-alert", "params": {"top_k": 3}}`, map[string][]byte{"previous": mine})
	a = c.do("POST", "/run", "", body, "Content-Type", ct)
	if a.status != 202 {
		t.Fatalf("POST /run with the file: %d %s", a.status, a.body)
	}
	var started wire.RecipeRunStarted
	a.json(t, &started)
	deadline := time.Now().Add(5 * time.Minute)
	var v wire.RunView
	for {
		c.do("GET", "/runs/"+started.RunID, "", nil).json(t, &v)
		if v.Status == "succeeded" || v.Status == "failed" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the run did not end: %+v", v)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if v.Status != "succeeded" {
		t.Fatalf("the run with an uploaded input: %s (%s)", v.Status, v.Error)
	}
	got := c.do("GET", "/tmp/files/data/competitor_snapshot_prev.json", started.RunID, nil)
	if !bytes.Equal(got.body, mine) {
		t.Errorf("the run's input holds %d bytes, not the %d uploaded", len(got.body), len(mine))
	}
	var setup wire.RunSetup
	c.do("GET", "/tmp/files/run.setup.json", started.RunID, nil).json(t, &setup)
	if setup.AsOf != "2026-10-30" {
		t.Errorf("the run's as_of is %q, want the uploaded snapshot's date", setup.AsOf)
	}

	// Refused launches leave nothing: not a fresh run id, nor a minted one.
	var before wire.RunList
	c.do("GET", "/runs", "", nil).json(t, &before)
	for _, tc := range []struct {
		name, request string
		files         map[string][]byte
	}{
		{"unknown param", `{"recipe": "competitor-alert", "run_id": "refused-1", "params": {"colour": "red"}}`, nil},
		{"unknown input", `{"recipe": "competitor-alert", "run_id": "refused-2"}`, map[string][]byte{"nope": []byte("x")}},
		{"unknown recipe, minted id", `{"recipe": "nope"}`, nil},
		{"unsupported backend", `{"recipe": "forecast-pack", "run_id": "refused-3"}`, nil},
	} {
		body, ct := form(t, tc.request, tc.files)
		if a := c.do("POST", "/run", "", body, "Content-Type", ct); a.status < 400 || a.status >= 500 {
			t.Errorf("%s: got %d %s, want a 4xx", tc.name, a.status, a.body)
		} else {
			a.errKind(t)
		}
	}
	for _, id := range []string{"refused-1", "refused-2", "refused-3"} {
		if a := c.do("GET", "/runs/"+id, "", nil); a.status != 404 {
			t.Errorf("GET /runs/%s after a refused launch: %d, want 404", id, a.status)
		}
	}
	var after wire.RunList
	c.do("GET", "/runs", "", nil).json(t, &after)
	if len(after.Runs) != len(before.Runs) {
		t.Errorf("refused launches left runs: %d before, %d after", len(before.Runs), len(after.Runs))
	}
	// A form without its request part is refused too.
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	mw.WriteField("other", "x")
	mw.Close()
	if a := c.do("POST", "/run", "", &b, "Content-Type", mw.FormDataContentType()); a.status != 400 || a.errKind(t) != "bad_input" {
		t.Errorf("a form with no request part: %d %s", a.status, a.body)
	}
}
