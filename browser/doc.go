// Package browser is the seam for web search: the browser.search contract, its validation, the provider interface and the citations record every call leaves behind.
//
// A Provider (browser/tavily wraps Tavily; browser/replay answers from
// recorded calls) turns a validated Request into a Record: the request sent
// upstream, the full raw upstream response, the normalised and deduplicated
// results, the time and the top domains. The caller stores Record.Marshal's
// bytes as a run file and reports their sha256 as citations_id, so every
// result an agent saw can be traced back to the raw answer it came from.
package browser
