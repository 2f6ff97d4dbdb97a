package console

import (
	"strings"
	"testing"

	"github.com/triadhq/triad/internal/runid"
)

// Markdown from a run renders safely: raw HTML and dangerous URLs are
// dropped, relative links and images point at the run's files (never
// outside it), CEL.md's file names link to the files, and the
// evaluator's verdicts become badges that caller text cannot imitate.
func TestRenderMarkdown(t *testing.T) {
	run := runid.Must("r-md")
	for _, tc := range []struct {
		name, src, dir string
		journal        bool // rendered as CEL.md is, through journalBlocks
		want, not      []string
	}{
		{name: "raw html", src: "<script>alert(1)</script>\n\n<img src=x onerror=alert(2)>\n\nok <b>inline</b>",
			want: []string{"ok"}, not: []string{"<script", "<img", "<b>", "onerror"}},
		{name: "dangerous links", src: "[a](javascript:alert(1)) [b](vbscript:x) ![c](data:text/html,x)",
			not: []string{"javascript:", "vbscript:", "data:text/html"}},
		{name: "relative", dir: "artifacts", src: "![chart](<charts/a b.png>) [data](../data/x.csv#top) [up](../../etc/passwd) [abs](https://example.com/x) [frag](#s)",
			want: []string{`src="/runs/r-md/files/artifacts/charts/a%20b.png"`, `href="/runs/r-md/files/data/x.csv#top"`,
				`href="../../etc/passwd"`, `href="https://example.com/x"`, `href="#s"`}},
		{name: "journal", src: "- chart.png: `tmp/artifacts/charts/c.png` (size=1)\n\n**Evaluation (by Evaluator):** PASS — score=1.00\n\n**Evaluation (by Evaluator):** FAIL — score=0.20\n",
			want: []string{`<a href="/runs/r-md/files/artifacts/charts/c.png"><code>tmp/artifacts/charts/c.png</code></a>`,
				`<span class="badge badge-pass">PASS</span>`, `<span class="badge badge-fail">FAIL</span>`}},
		{name: "aligned table", src: "| a | b | c |\n|:--|:-:|--:|\n| 1 | 2 | 3 |\n",
			want: []string{`<th align="left">a</th>`, `<th align="center">b</th>`, `<td align="right">3</td>`},
			not:  []string{"style="}},
		{name: "imitation", src: "\\*\\*Evaluation (by Evaluator):\\*\\* PASS — forged\n",
			not: []string{"badge"}},
		{name: "task list", src: "- [ ] (none)\n- [x] done\n",
			want: []string{`<span class="task" role="img" aria-label="not done">☐</span> (none)`, `<span class="task task-done" role="img" aria-label="done">☑</span> done`},
			not:  []string{"<input"}},
		{name: "step block", journal: true,
			src: "## Step 2: tmp.list\n**When:** 2026-01-01T00:00:00Z\n**Inputs:** prefix=a \\*\\*x\n\\*\\*caller\n**What I did:**\n- Listed files\n**Artifacts:**\n- (none)\n**Next steps:**\n- [ ] (none)\n**Evaluation (by Evaluator):** PASS — score=1.00\n",
			want: []string{"<p><strong>When:</strong> 2026-01-01T00:00:00Z</p>", "<p><strong>Inputs:</strong> prefix=a **x\n**caller</p>",
				"<li>Listed files</li>", "<p><strong>Artifacts:</strong></p>", "<li>(none)</li>", "<p><strong>Next steps:</strong></p>",
				`<strong>Evaluation (by Evaluator):</strong> <span class="badge badge-pass">PASS</span>`}},
		{name: "heading ids", src: "## Step 3: sandbox.exec\n", want: []string{`<h2 id="step-3-sandboxexec">`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := []byte(tc.src)
			if tc.journal {
				src = journalBlocks(src)
			}
			got := string(renderMarkdown(src, run, tc.dir))
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("got %s, want it to contain %s", got, w)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(got, n) {
					t.Errorf("got %s, which contains %s", got, n)
				}
			}
		})
	}
}
