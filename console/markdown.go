package console

import (
	"bytes"
	"net/url"
	"path"
	"regexp"
	"strings"

	"github.com/yuin/goldmark"
	"github.com/yuin/goldmark/ast"
	"github.com/yuin/goldmark/extension"
	east "github.com/yuin/goldmark/extension/ast"
	"github.com/yuin/goldmark/parser"
	"github.com/yuin/goldmark/renderer"
	"github.com/yuin/goldmark/text"
	"github.com/yuin/goldmark/util"

	"github.com/triadhq/triad/internal/runid"
)

// renderMarkdown renders a run's Markdown file (CEL.md, or a .md file in
// dir) to HTML for a console page. goldmark's default, safe renderer
// drops raw HTML and javascript: (and other dangerous) URLs, so what a
// cell or a caller wrote renders as text; the journal escapes caller text
// besides (cel/text.go). Relative links and images point at the run's
// files, a `tmp/...` code span (how CEL.md names a file) links to it,
// and the evaluator's verdicts become badges.
func renderMarkdown(src []byte, run runid.ID, dir string) []byte {
	md := goldmark.New(
		// GFM, with table cells aligned by the align attribute: the
		// default style attribute is inline CSS, which the console's
		// Content-Security-Policy refuses (a console error per cell, and
		// the alignment lost).
		goldmark.WithExtensions(extension.NewTable(extension.WithTableCellAlignMethod(extension.TableCellAlignAttribute)),
			extension.Strikethrough, extension.Linkify, extension.TaskList),
		goldmark.WithParserOptions(parser.WithAutoHeadingID(),
			parser.WithASTTransformers(util.Prioritized(&runLinks{run: run, dir: dir}, 100))),
		goldmark.WithRendererOptions(renderer.WithNodeRenderers(util.Prioritized(taskBoxes{}, 100))),
	)
	var out bytes.Buffer
	if err := md.Convert(src, &out); err != nil {
		// goldmark fails only on a writer error; show the source as text.
		out.Reset()
		out.WriteString("<pre>")
		out.WriteString(strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(string(src)))
		out.WriteString("</pre>")
	}
	return badges(out.Bytes())
}

// journalBlocks makes each labelled line of CEL.md's Step Blocks
// ("**When:**", "**What I did:**", "**Artifacts:**", ...) start a
// paragraph of its own. The spec's format puts them on consecutive lines,
// which Markdown joins into one paragraph or, after a list, into the
// list's last item ("(none) Next steps:"). CEL.md itself is left as the
// spec has it; this is for reading it in the console. Only Triad writes a
// line that starts with "**": the journal escapes * in caller text.
func journalBlocks(src []byte) []byte {
	lines := bytes.SplitAfter(src, []byte("\n"))
	out := make([]byte, 0, len(src)+len(src)/16)
	prevBlank := true
	for _, l := range lines {
		if bytes.HasPrefix(l, []byte("**")) && !prevBlank {
			out = append(out, '\n')
		}
		out = append(out, l...)
		prevBlank = len(bytes.TrimSpace(l)) == 0
	}
	return out
}

// taskBoxes renders a task list's box ("- [ ]", as in CEL.md's plan) as
// a mark with an accessible name, where GFM's renderer makes a disabled
// checkbox with no label. Registered with a lower priority value than
// GFM's (500), it replaces that renderer.
type taskBoxes struct{}

// RegisterFuncs implements renderer.NodeRenderer.
func (taskBoxes) RegisterFuncs(reg renderer.NodeRendererFuncRegisterer) {
	reg.Register(east.KindTaskCheckBox, func(w util.BufWriter, _ []byte, n ast.Node, entering bool) (ast.WalkStatus, error) {
		if !entering {
			return ast.WalkContinue, nil
		}
		if n.(*east.TaskCheckBox).IsChecked {
			w.WriteString(`<span class="task task-done" role="img" aria-label="done">☑</span> `)
		} else {
			w.WriteString(`<span class="task" role="img" aria-label="not done">☐</span> `)
		}
		return ast.WalkContinue, nil
	})
}

// fileURL is where the console previews a run file.
func fileURL(run runid.ID, p string) string {
	segs := strings.Split(p, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return "/runs/" + run.String() + "/files/" + strings.Join(segs, "/")
}

// runLinks points relative links and images at the run's files.
type runLinks struct {
	run runid.ID
	dir string
}

// Transform implements parser.ASTTransformer.
func (t *runLinks) Transform(doc *ast.Document, reader text.Reader, pc parser.Context) {
	src := reader.Source()
	var spans []*ast.CodeSpan
	ast.Walk(doc, func(n ast.Node, entering bool) (ast.WalkStatus, error) {
		if !entering {
			return ast.WalkContinue, nil
		}
		switch n := n.(type) {
		case *ast.Link:
			n.Destination = t.rewrite(n.Destination)
		case *ast.Image:
			n.Destination = t.rewrite(n.Destination)
		case *ast.CodeSpan:
			if _, inLink := n.Parent().(*ast.Link); !inLink {
				spans = append(spans, n)
			}
		}
		return ast.WalkContinue, nil
	})
	for _, cs := range spans {
		var b strings.Builder
		for c := cs.FirstChild(); c != nil; c = c.NextSibling() {
			if tx, ok := c.(*ast.Text); ok {
				b.Write(tx.Segment.Value(src))
			}
		}
		p, ok := strings.CutPrefix(b.String(), "tmp/")
		if !ok || p == "" || strings.Contains(p, "..") || strings.ContainsAny(p, " \t") {
			continue
		}
		link := ast.NewLink()
		link.Destination = []byte(fileURL(t.run, p))
		parent := cs.Parent()
		parent.ReplaceChild(parent, cs, link)
		link.AppendChild(link, cs)
	}
}

// rewrite resolves a relative destination against the file's directory;
// absolute URLs, fragments and paths outside the run are left alone (the
// renderer drops dangerous schemes).
func (t *runLinks) rewrite(dest []byte) []byte {
	d := string(dest)
	if d == "" || strings.HasPrefix(d, "#") || strings.HasPrefix(d, "/") || strings.Contains(d, ":") {
		return dest
	}
	u, err := url.Parse(d)
	if err != nil || u.Path == "" {
		return dest
	}
	p := path.Clean(path.Join(t.dir, u.Path))
	if p == "." || p == ".." || strings.HasPrefix(p, "../") || strings.HasPrefix(p, "/") {
		return dest
	}
	out := fileURL(t.run, p)
	if u.Fragment != "" {
		out += "#" + url.PathEscape(u.Fragment)
	}
	return []byte(out)
}

// verdictRE matches the evaluator's line as goldmark renders it. Caller
// text cannot produce it: the journal escapes * and < in caller text, so
// only Triad's own "**Evaluation (by Evaluator):**" renders as <strong>.
var verdictRE = regexp.MustCompile(`<strong>Evaluation \(by Evaluator\):</strong> (PASS|FAIL|UNGRADED) `)

// badges turns the evaluator's verdicts into badges: UNGRADED (the
// evaluator could not answer yet) has its own, never FAIL's.
func badges(html []byte) []byte {
	return verdictRE.ReplaceAllFunc(html, func(m []byte) []byte {
		v := "FAIL"
		switch {
		case bytes.Contains(m, []byte("UNGRADED")):
			v = "UNGRADED"
		case bytes.Contains(m, []byte("PASS")):
			v = "PASS"
		}
		return []byte(`<strong>Evaluation (by Evaluator):</strong> <span class="badge badge-` + strings.ToLower(v) + `">` + v + `</span> `)
	})
}
