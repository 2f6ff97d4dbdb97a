// Package recipes parses, validates and binds recipes: Markdown files with YAML front matter whose fenced blocks are the ordered tool calls of a workflow.
//
// # Format
//
// A recipe reads as documentation on a code host and runs as a workflow. It
// starts with YAML front matter between two "---" lines:
//
//	---
//	name: market-scan            # [a-z0-9-], equal to the file name without .md
//	title: Market scan
//	description: One paragraph a caller reads in GET /recipes.
//	backend: any                 # any | docker: docker when cells need numpy/pandas
//	params:                      # in order; each becomes a Python variable
//	  objective: {type: string, default: "...", description: "..."}
//	  top_k: {type: int, default: 6}
//	  competitors: {type: list, default: [Acme, Globex]}
//	inputs:                      # files the run is seeded with
//	  leads: {path: data/leads.csv, default: leads.csv, description: "..."}
//	outputs:                     # deliverables, with optional checks
//	  - artifacts/report.md
//	  - {path: artifacts/kpis.csv, columns: [channel, cac], min_rows: 3}
//	---
//
// Param types are string, int, float, bool and list (a list of scalars). A
// param that is neither required nor defaulted takes its type's zero value.
// Every recipe has an "objective" string param; one is added (default "") when
// the front matter does not declare it. Input defaults name files of the
// bundled sample data (package recipes/sampledata).
//
// The body is Markdown. Three kinds of fenced block are steps, run in order;
// fences in any other language are prose:
//
//   - ```python {outputs: [facts.json], timeout: 120}
//     A sandbox.exec cell. Its source is never templated: cells read the
//     params from the variables of the injected parameters cell, as with
//     Papermill, and read every other input from files. A ```r,
//     ```javascript (```js), ```typescript (```ts) or ```bash block is a
//     cell in that language (wire.ExecRequest.Language), with the same
//     attributes, run in the run's default interpreter of the language
//     (a bash block in the run's bash kernel); the params are Python
//     variables only, so such a cell reads what it needs from files.
//   - ```search
//     YAML args for browser.search (query, top_k, include_page,
//     allow_domains, date_range) plus save_as, the run path the results are
//     saved to, and optionally foreach, the name of a list param: the block
//     then becomes one search step per item, with the item in {{ item }}.
//   - ```write {path: notes/brief.md}
//     A tmp.write of the block's text to path. With {raw: true} the text is
//     written as is, which suits Jinja templates that use {{ }} themselves.
//
// The optional flow mapping after the language (the "info string", which code
// hosts hide) holds the step's attributes: id, outputs and timeout (seconds)
// for python; id, path and raw for write; id for search. outputs lists the run
// paths the step must produce; an output also declared in the front matter
// carries that declaration's checks.
//
// # Templating
//
// Search args, write text and paths, and output paths are Go text/template
// templates evaluated once per run when the recipe is bound:
//
//	{{ params.objective }}     a param's value
//	{{ item }}                 the current item inside a foreach search block
//	{{ inputs.leads }}         an input's run path
//	{{ item | slug }}          lowercase, [a-z0-9-] only: safe in a file name
//	{{ params.list | join ", " }}, lower, upper, trim, json
//
// A reference to an unknown param is an error, and the functions can reach
// nothing but the bound values, so a template cannot read files or the
// environment. Templates are applied to YAML values after parsing, never to
// the YAML text, so a param's value cannot inject keys; a value that is
// exactly one {{ ... }} action keeps its type (top_k: "{{ params.top_k }}"
// stays an integer). YAML reads an unquoted {{ as a mapping, so quote it.
//
// # Errors
//
// Parse and Bind return a *fault.Error of kind fault.BadInput. Parse errors
// name the file, the line and the problem, for example
// "market-scan.md:14: search block: unknown field \"topk\"".
package recipes
