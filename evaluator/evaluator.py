"""Triad's evaluator: grades one tool call on four dimensions, each 0..1.

It runs in a jailed WASI interpreter separate from every user kernel, so no
cell can change its verdict. It reads requests from stdin and writes verdicts
to stdout, one JSON document per line each. A request names a directory
(mounted read-only) holding copies of the step's artifacts, plus the step's
metadata. Only the standard library is used.
"""
import csv
import html.parser
import io
import json
import os
import re
import struct
import sys
import zlib

ROOT = "/in"
PASS_THRESHOLD = 0.75
URL_RE = re.compile(r"https?://[^\s<>\"')\]]+")
NUMBER_RE = re.compile(r"\d")


def check_csv(data, expect):
    text = data.decode("utf-8-sig")
    rows = list(csv.reader(io.StringIO(text)))
    if not rows:
        return False, "is empty"
    header, body = rows[0], [r for r in rows[1:] if any(c.strip() for c in r)]
    missing = [c for c in expect.get("columns", []) if c not in header]
    if missing:
        return False, "lacks columns %s" % ", ".join(missing)
    min_rows = expect.get("min_rows", 1)
    if len(body) < min_rows:
        return False, "has %d data rows, want at least %d" % (len(body), min_rows)
    widths = {len(r) for r in body}
    if len(widths) > 1 and max(widths) > len(header):
        return False, "has ragged rows"
    return True, "%d rows" % len(body)


def check_json(data, expect):
    v = json.loads(data.decode("utf-8"))
    for k in expect.get("keys", []):
        if not isinstance(v, dict) or k not in v:
            return False, "lacks key %r" % k
    if v in ({}, [], None, ""):
        return False, "is empty"
    return True, "parses"


def check_jsonl(data, expect):
    n = 0
    for line in data.decode("utf-8").splitlines():
        if line.strip():
            json.loads(line)
            n += 1
    return n > 0, "%d records" % n


def check_png(data, expect):
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        return False, "has no PNG signature"
    pos, idat, seen_end, w, h = 8, [], False, 0, 0
    while pos + 8 <= len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        chunk = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        if zlib.crc32(kind + chunk) & 0xFFFFFFFF != crc:
            return False, "has a corrupt %s chunk" % kind.decode("latin-1")
        if kind == b"IHDR":
            w, h = struct.unpack(">II", chunk[:8])
        elif kind == b"IDAT":
            idat.append(chunk)
        elif kind == b"IEND":
            seen_end = True
            break
        pos += 12 + length
    if not seen_end or not idat or w == 0 or h == 0:
        return False, "is truncated"
    zlib.decompress(b"".join(idat))
    return True, "%dx%d" % (w, h)


class _Text(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.text, self.tags = [], 0

    def handle_starttag(self, tag, attrs):
        self.tags += 1

    def handle_data(self, d):
        if d.strip():
            self.text.append(d.strip())


_parsed = {}  # id(data) -> _Text, for the step being graded


def html_text(data):
    # An HTML artifact is read by both the correctness and the evidence
    # checks; html.parser is the slowest thing here, so parse it once.
    # grade() keeps each artifact's bytes alive while it runs, so an id
    # is not reused within a step.
    p = _parsed.get(id(data))
    if p is None:
        p = _Text()
        p.feed(data.decode("utf-8", "replace"))
        p.close()
        _parsed[id(data)] = p
    return p


def check_html(data, expect):
    p = html_text(data)
    if p.tags == 0 or not p.text:
        return False, "has no markup or no text"
    text = " ".join(p.text)
    missing = [c for c in expect.get("contains", []) if c not in text]
    if missing:
        return False, "lacks %s" % ", ".join(repr(m) for m in missing)
    return True, "%d tags" % p.tags


def check_text(data, expect):
    text = data.decode("utf-8")
    if not text.strip():
        return False, "is blank"
    missing = [c for c in expect.get("contains", []) if c not in text]
    if missing:
        return False, "lacks %s" % ", ".join(repr(m) for m in missing)
    return True, "%d lines" % (text.count("\n") + 1)


def check_pdf(data, expect):
    if not data.startswith(b"%PDF-") or b"%%EOF" not in data[-2048:]:
        return False, "is not a complete PDF"
    return True, "PDF"


CHECKS = {
    ".csv": check_csv, ".json": check_json, ".jsonl": check_jsonl, ".png": check_png,
    ".html": check_html, ".htm": check_html, ".md": check_text, ".txt": check_text,
    ".pdf": check_pdf, ".ipynb": check_json,
}


def grade(req):
    try:
        return _grade(req)
    finally:
        _parsed.clear()


def _grade(req):
    tool = req["tool"]
    ok = req.get("ok", True)
    arts = req.get("artifacts") or []
    expected = req.get("expected") or []
    mounted = os.path.join(ROOT, req["dir"]) if req.get("dir") else None
    notes = []

    contents = {}

    def read(path):
        if path in contents:
            return contents[path]
        data = None
        p = os.path.join(mounted, path) if mounted else None
        if p and os.path.isfile(p):
            with open(p, "rb") as f:
                data = f.read()
        contents[path] = data
        return data

    by_path = {a["path"]: a for a in arts}

    # Completeness: expected artifacts exist and are non-empty. A manual call
    # expects its own outputs; a failed call is incomplete by definition.
    if not ok:
        completeness = 0.0
        notes.append("the call failed: " + (req.get("error") or "no reason given"))
    elif expected:
        have = 0
        for e in expected:
            a = by_path.get(e["path"]) or (req.get("run_files") or {}).get(e["path"])
            if a and a.get("size", 0) > 0:
                have += 1
            else:
                notes.append("expected artifact %s is missing or empty" % e["path"])
        completeness = have / len(expected)
    elif tool in ("tmp.write",):
        completeness = 1.0 if arts and arts[0].get("size", 0) > 0 else 0.5
        if completeness < 1:
            notes.append("the written file is empty")
    else:
        completeness = 1.0

    # Correctness: every artifact of a known type parses and has content.
    checked, good = 0, 0
    expect_by_path = {e["path"]: e for e in expected}
    for a in arts:
        ext = os.path.splitext(a["path"])[1].lower()
        fn = CHECKS.get(ext)
        if fn is None:
            continue
        data = read(a["path"])
        if data is None:
            continue  # too large to inspect here; completeness covered it
        checked += 1
        try:
            passed, why = fn(data, expect_by_path.get(a["path"], {}))
        except Exception as e:  # noqa: BLE001 - any parse failure is a finding
            passed, why = False, "does not parse (%s: %s)" % (type(e).__name__, str(e)[:80])
        if passed:
            good += 1
        else:
            notes.append("%s %s" % (a["path"], why))
    if not ok:
        correctness = 0.0
    elif checked:
        correctness = good / checked
    else:
        correctness = 1.0

    # Evidence: claims in markdown/HTML artifacts cite URLs from the run's
    # recorded searches, or URLs its sandbox fetched through the egress
    # proxy (a passed-through HTTPS fetch is known by its origin only), or
    # name a dataset in the run.
    cited = set(req.get("citation_urls") or []) | set(req.get("fetched_urls") or [])
    origins = {u for u in (req.get("fetched_urls") or []) if u.endswith("/") and u.count("/") == 3}

    def known_url(u):
        if u in cited:
            return True
        parts = u.split("/")
        return len(parts) > 3 and "/".join(parts[:3]) + "/" in origins

    datasets = [d for d in (req.get("datasets") or []) if d]
    scores = []
    if tool == "browser.search" and ok and not req.get("results"):
        scores.append(0.5)
        notes.append("the search returned no results, so it adds no evidence")
    for a in arts:
        ext = os.path.splitext(a["path"])[1].lower()
        if ext not in (".md", ".html", ".htm"):
            continue
        data = read(a["path"])
        if data is None:
            continue
        text = data.decode("utf-8", "replace")
        if ext != ".md":
            text = " ".join(html_text(data).text) + " " + " ".join(URL_RE.findall(text))
        urls = {u.rstrip(".,;:") for u in URL_RE.findall(text)}
        names = [d for d in datasets if d in text or os.path.basename(d) in text]
        if not NUMBER_RE.search(text) and not urls:
            scores.append(1.0)  # no claims to back
            continue
        if urls:
            known = [u for u in urls if known_url(u)]
            s = len(known) / len(urls)
            if s < 1:
                notes.append("%s cites %d URL(s) not in the run's citations" % (a["path"], len(urls) - len(known)))
            if names:
                s = max(s, 0.75)
            scores.append(s)
        elif names:
            scores.append(1.0)
        else:
            scores.append(0.0)
            notes.append("%s makes claims but cites no source or dataset" % a["path"])
    evidence = sum(scores) / len(scores) if scores else 1.0

    # Hygiene: a clean stderr, no restarts, the journal left alone, and the
    # runtime within budget.
    hygiene = 1.0
    stderr = req.get("stderr", "")
    if re.search(r"Traceback|Error\b|Exception\b", stderr):
        hygiene -= 0.5
        notes.append("stderr shows an error")
    elif re.search(r"[Ww]arning\b", stderr):
        hygiene -= 0.25
        notes.append("stderr shows a warning")
    elif stderr.strip():
        hygiene -= 0.1
    if not ok:
        hygiene -= 0.25
    if req.get("restarted"):
        hygiene -= 0.25
        notes.append("the kernel restarted and lost its state")
    if req.get("tampered"):
        hygiene -= 0.5
        notes.append("the cell changed the journal (%s); it was restored" % ", ".join(req["tampered"] or []))
    budget = req.get("budget_ms") or 0
    if budget and req.get("elapsed_ms", 0) > budget:
        hygiene -= 0.25
        notes.append("the call ran past its time budget")
    hygiene = max(0.0, hygiene)

    dims = [completeness, correctness, evidence, hygiene]
    score = sum(dims) / 4
    # A step passes when it did what it set out to (every expected artifact,
    # a successful call), nothing is badly wrong, and the whole is good.
    passed = ok and completeness >= 1.0 and min(dims) >= 0.5 and score >= PASS_THRESHOLD
    if not notes:
        notes.append("all checks passed" + (" on %d artifact(s)" % checked if checked else ""))
    critique = "; ".join(notes[:3])
    if len(notes) > 3:
        critique += "; and %d more" % (len(notes) - 3)
    return {
        "pass": passed,
        "score": round(score, 4),
        "completeness": round(completeness, 4),
        "correctness": round(correctness, 4),
        "evidence": round(evidence, 4),
        "hygiene": round(hygiene, 4),
        "critique": critique + ".",
    }


def main():
    out = sys.stdout
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            verdict = grade(json.loads(line))
        except Exception as e:  # noqa: BLE001 - a verdict always comes back
            verdict = {"error": "%s: %s" % (type(e).__name__, e)}
        out.write(json.dumps(verdict) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
