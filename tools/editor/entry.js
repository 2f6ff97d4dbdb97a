// The console's code editor and highlighter: CodeMirror 6 with the Python
// language, wrapped in the two functions the console's pages call. build.sh
// bundles this file and its dependencies into console/static/vendor/editor.js.
//
// Highlighting marks tokens with classes (tok-keyword, tok-string, ...:
// @lezer/highlight's classHighlighter), which console.css colours for light
// and dark. CodeMirror's own layout styles go in one <style> element that
// carries the page's CSP nonce (option nonce): the console's
// Content-Security-Policy allows no other inline style.
import { EditorState } from '@codemirror/state';
import {
  EditorView, keymap, drawSelection, highlightSpecialChars, placeholder as placeholderText,
} from '@codemirror/view';
import { defaultKeymap, history, historyKeymap, indentWithTab } from '@codemirror/commands';
import {
  LanguageSupport, bracketMatching, indentOnInput, indentUnit, syntaxHighlighting,
} from '@codemirror/language';
import { pythonLanguage } from '@codemirror/lang-python';
import { classHighlighter, highlightCode } from '@lezer/highlight';

// createEditor makes an editor in parent. Options: doc (its text), label
// (its accessible name), language ('python', or '' for plain text such as
// Markdown), placeholder, readOnly, keys (extra key bindings, CodeMirror's
// {key, run} objects, which win over the defaults), onChange(text), nonce
// (the page's CSP nonce for CodeMirror's <style> element).
// Tab indents; Escape then Tab moves the focus on, as CodeMirror documents.
export function createEditor(parent, opts = {}) {
  const {
    doc = '', label = 'Code', language = 'python', placeholder = '', readOnly = false, keys = [], onChange, nonce = '',
  } = opts;
  const extensions = [
    highlightSpecialChars(),
    history(),
    drawSelection(),
    indentUnit.of('    '),
    EditorState.tabSize.of(4),
    indentOnInput(),
    bracketMatching(),
    syntaxHighlighting(classHighlighter),
    keymap.of([...keys, indentWithTab, ...defaultKeymap, ...historyKeymap]),
    EditorView.lineWrapping,
    EditorView.contentAttributes.of({ 'aria-label': label, spellcheck: 'false', autocorrect: 'off', autocapitalize: 'off' }),
  ];
  if (nonce) extensions.push(EditorView.cspNonce.of(nonce));
  // The language alone: lang-python's completions would bring
  // @codemirror/autocomplete into the bundle for little use here.
  if (language === 'python') extensions.push(new LanguageSupport(pythonLanguage));
  if (placeholder) extensions.push(placeholderText(placeholder));
  if (readOnly) extensions.push(EditorState.readOnly.of(true), EditorView.editable.of(false));
  if (onChange) {
    extensions.push(EditorView.updateListener.of((u) => {
      if (u.docChanged) onChange(u.state.doc.toString());
    }));
  }
  const view = new EditorView({ state: EditorState.create({ doc, extensions }), parent });
  return {
    view,
    get value() {
      return view.state.doc.toString();
    },
    set value(text) {
      view.dispatch({ changes: { from: 0, to: view.state.doc.length, insert: text } });
    },
    focus() {
      view.focus();
    },
    // atStart and atEnd say whether the cursor is on the first or last
    // line, for moving between cells with the arrow keys.
    get atStart() {
      const s = view.state;
      return s.doc.lineAt(s.selection.main.head).number === 1;
    },
    get atEnd() {
      const s = view.state;
      return s.doc.lineAt(s.selection.main.head).number === s.doc.lines;
    },
    destroy() {
      view.destroy();
    },
  };
}

// highlight returns Python code as a fragment of text and classed spans,
// for code shown and not edited (a step's cell, a notebook's cells).
export function highlight(code) {
  const out = document.createDocumentFragment();
  const tree = pythonLanguage.parser.parse(code);
  highlightCode(code, tree, classHighlighter, (text, classes) => {
    if (!classes) {
      out.append(document.createTextNode(text));
      return;
    }
    const span = document.createElement('span');
    span.className = classes;
    span.textContent = text;
    out.append(span);
  }, () => out.append(document.createTextNode('\n')));
  return out;
}
