// Delta Fleet's web inbox: plain JavaScript, no build step, no dependencies.
//
// `/`              the pending questions: GET /v1/interactions (every page), then live through
//                  the `requested` / `resolved` events of GET /v1/interactions/stream.
// `/runs/<run_id>` one run: status, journal live (GET /v1/runs/<id>/events), its question.
//
// Everything the server sends is written with textContent (never as markup). The token, when
// there is one, lives in localStorage and goes out only as `Authorization: Bearer`, never in a
// URL: EventSource cannot send headers, so each live stream is opened with a one-time ticket
// (POST /v1/stream-tickets), a fresh one for every connection. EventSource's own reconnect would
// reuse a spent ticket, so on any error the stream is closed and opened anew.
(() => {
  'use strict';

  const TOKEN_KEY = 'delta.inbox.token';
  const NAME_KEY = 'delta.inbox.responder';
  const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

  const $ = (id) => document.getElementById(id);

  // ---------------------------------------------------------------------------------------
  // Small helpers

  /** An element: `attrs` are properties (`text`, `class`, `dataset`, or attributes); children
   * are nodes or strings (as text). */
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'text') node.textContent = String(v);
      else if (k === 'class') node.className = v;
      else if (k === 'dataset') {
        for (const [dk, dv] of Object.entries(v)) if (dv !== undefined && dv !== null) node.dataset[dk] = String(dv);
      }
      else if (k === 'on') for (const [ev, fn] of Object.entries(v)) node.addEventListener(ev, fn);
      else if (v === true) node.setAttribute(k, '');
      else node.setAttribute(k, String(v));
    }
    for (const c of children.flat()) {
      if (c === undefined || c === null || c === false) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  /** The class of a risk chip: one of the three the style knows. The risk is the agent's (or
   * its LLM's) text, which as a class name could add any class of the page. */
  function riskClass(risk) {
    return ['low', 'medium', 'high'].includes(risk) ? `risk-${risk}` : 'risk-other';
  }

  function storageGet(key) {
    try { return localStorage.getItem(key) || ''; } catch (_) { return ''; }
  }
  function storageSet(key, value) {
    try {
      if (value) localStorage.setItem(key, value); else localStorage.removeItem(key);
    } catch (_) { /* private mode: kept for this page only */ }
  }
  let token = storageGet(TOKEN_KEY);
  // A link may carry the token once, in the fragment (`#token=…`, which the browser never sends
  // to the server): it is kept like a typed one and taken out of the address bar at once. One
  // that differs from the token this browser keeps is only offered (see `start`): a link from
  // someone else must not sign this browser in as them without a word.
  // Never taken without a word, even by a browser that keeps none: a link from someone else
  // would sign this browser in as them, and the person's answers would be recorded as theirs.
  const fromLink = new URLSearchParams(location.hash.slice(1)).get('token');
  let offeredToken = '';
  if (fromLink) {
    const offered = fromLink.trim();
    if (token !== offered) offeredToken = offered;
    history.replaceState(null, '', location.pathname + location.search);
  }
  function offerText() {
    return token
      ? 'This link carries another token than the one this browser keeps: Save to use it, or Close to keep yours.'
      : 'This link carries a token: Save to sign in with it, if you trust whoever gave you the link (your answers are recorded as its name).';
  }
  let responderName = storageGet(NAME_KEY);
  // `/answer#link=…`: a one-time answer link (made for an MCP or A2A client's question). The
  // link is the credential for its one question: no token is sent, and it is kept for this tab
  // only (sessionStorage), out of the address bar.
  const LINK_KEY = 'delta.inbox.link';
  let answerLink = '';
  if (location.pathname === '/answer') {
    const fromHash = new URLSearchParams(location.hash.slice(1)).get('link');
    if (fromHash) {
      answerLink = fromHash.trim();
      try { sessionStorage.setItem(LINK_KEY, answerLink); } catch (_) { /* this page only */ }
      history.replaceState(null, '', location.pathname);
    } else {
      try { answerLink = sessionStorage.getItem(LINK_KEY) || ''; } catch (_) { answerLink = ''; }
    }
    // Another link followed in this tab changes only the fragment: start over with it.
    window.addEventListener('hashchange', () => {
      if (new URLSearchParams(location.hash.slice(1)).get('link')) location.reload();
    });
  }

  /** Milliseconds since the epoch of an RFC 3339 time (microseconds cut to milliseconds). */
  function parseTime(s) {
    if (typeof s !== 'string') return NaN;
    return Date.parse(s.replace(/(\.\d{3})\d+/, '$1'));
  }

  function span(ms) {
    const s = Math.max(0, Math.round(ms / 1000));
    if (s < 60) return `${s} s`;
    const m = Math.floor(s / 60);
    if (m < 60) return `${m} min ${s % 60} s`;
    const h = Math.floor(m / 60);
    if (h < 48) return `${h} h ${m % 60} min`;
    return `${Math.floor(h / 24)} d ${h % 24} h`;
  }

  function ago(t) {
    const ms = Date.now() - t;
    return ms < 1000 ? 'just now' : `${span(ms).replace(/ \d+ (s|min)$/, '')} ago`;
  }

  function clock(t) {
    const d = new Date(t);
    return Number.isNaN(d.getTime()) ? '' : d.toLocaleTimeString([], { hour12: false });
  }

  /** A moment that may be days away (a grant's or a link's end): the time of day when it is
   * today, else with its date, and the time zone either way. */
  function when(t) {
    const d = new Date(t);
    if (Number.isNaN(d.getTime())) return '';
    const today = d.toDateString() === new Date().toDateString();
    return d.toLocaleString([], {
      ...(today ? {} : { year: 'numeric', month: 'short', day: 'numeric' }),
      hour: '2-digit', minute: '2-digit', hour12: false, timeZoneName: 'short',
    });
  }

  // The last characters: ids are UUIDv7, whose first ones are a timestamp shared by runs
  // started close together.
  function shortId(id) { return String(id || '').slice(-8); }

  // Characters that show nothing or turn the text around them (zero-width, bidirectional
  // controls, other controls): in what a person approves (a command, arguments, a tool's name)
  // they would make it read as something else than what runs. Shown as `\uXXXX`, which in
  // JSON means the same character.
  // Controls (but line breaks and tabs), format characters (zero-width, bidirectional, tags),
  // line and paragraph separators; a character beyond U+FFFF as its UTF-16 pair, as JSON does.
  const HIDDEN = /(?![\n\t])[\p{Cc}\p{Cf}\p{Zl}\p{Zp}]/gu;
  function visible(text) {
    return String(text).replace(HIDDEN, (c) => Array.from({ length: c.length },
      (_, i) => `\\u${c.charCodeAt(i).toString(16).padStart(4, '0')}`).join(''));
  }

  function pretty(value) {
    try { return visible(JSON.stringify(value, null, 2)); } catch (_) { return visible(String(value)); }
  }

  function parseJson(text) {
    try { return JSON.parse(text); } catch (_) { return null; }
  }

  /** `path` with a fresh one-time ticket for `target` (`{stream: 'interactions'}` or
   * `{stream: 'run', run_id}`), asked for with the token: the token never goes in a URL. */
  async function withTicket(path, target) {
    const t = await api('POST', '/v1/stream-tickets', target);
    return path + (path.includes('?') ? '&' : '?') + 'ticket=' + encodeURIComponent(t.ticket);
  }

  let toastTimer = 0;
  function toast(text) {
    const t = $('toast');
    t.textContent = text;
    t.hidden = false;
    clearTimeout(toastTimer);
    toastTimer = setTimeout(() => { t.hidden = true; }, 6000);
  }

  // ---------------------------------------------------------------------------------------
  // The API

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  async function api(method, path, body) {
    if (answerLink) {
      // Through the link: its question is read and answered with the link, never a token.
      if (method === 'POST' && /^\/v1\/interactions\/[^/]+\/response$/.test(path)) {
        path = '/v1/answer-links/answer';
        body = { link: answerLink, answer: body };
      } else if (method === 'GET' && /^\/v1\/interactions\/[^/]+$/.test(path)) {
        const v = await api('POST', '/v1/answer-links/open', { link: answerLink });
        return v.interaction;
      }
    }
    const headers = { Accept: 'application/json' };
    if (token && !answerLink) headers.Authorization = `Bearer ${token}`;
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    let resp;
    try {
      resp = await fetch(path, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        cache: 'no-store',
        credentials: 'omit',
      });
    } catch (_) {
      throw new ApiError(0, 'unreachable', 'The gateway cannot be reached; check the connection and try again.');
    }
    const data = await resp.json().catch(() => null);
    if (!resp.ok) {
      const e = (data && data.error) || {};
      const err = new ApiError(resp.status, e.code || `http_${resp.status}`,
        e.message || `${resp.status} ${resp.statusText}`);
      if (resp.status === 401) askForToken(err);
      throw err;
    }
    return data;
  }

  // ---------------------------------------------------------------------------------------
  // Settings: the token and the name

  const settings = $('settings');

  function openSettings(reason) {
    settings.hidden = false;
    $('settings-toggle').setAttribute('aria-expanded', 'true');
    $('settings-reason').textContent = reason || '';
    $('settings-reason').hidden = !reason;
    $('token').value = offeredToken && reason === offerText() ? offeredToken : token;
    $('responder').value = responderName;
    $('token').focus();
  }

  /** Signed out (a token forgotten or refused): nothing read with it stays on the page. */
  function clearShown() {
    inbox.lastId = 0; // whoever signs in next gets a listing of their own
    for (const card of inbox.cards.values()) card.node.remove();
    inbox.cards.clear();
    $('cards').replaceChildren();
    $('grants').replaceChildren();
    $('grants-view').hidden = true;
    // The run page: its question and journal.
    if (run.card) { run.card.node.remove(); run.card = null; }
    $('run-question').replaceChildren();
    $('journal').replaceChildren();
    run.lastSeq = 0;
    renderCount();
  }

  function closeSettings() {
    // A link's token is offered once, with its warning: closed without Save, it is gone.
    offeredToken = '';
    settings.hidden = true;
    $('settings-toggle').setAttribute('aria-expanded', 'false');
  }

  let lastTokenAsk = '';
  function askForToken(err) {
    const reason = offeredToken
      ? offerText()
      : token
        ? `This token was refused (${err.message}). Enter another one.`
        : 'This gateway needs a token: enter the one an operator gave you.';
    setConn('locked');
    clearShown();
    if (!settings.hidden && lastTokenAsk === reason) return;
    lastTokenAsk = reason;
    openSettings(reason);
  }

  $('settings-toggle').addEventListener('click', () => {
    if (settings.hidden) openSettings(''); else closeSettings();
  });
  $('settings-close').addEventListener('click', closeSettings);
  $('settings-forget').addEventListener('click', () => {
    $('token').value = '';
    token = '';
    offeredToken = '';
    storageSet(TOKEN_KEY, '');
    clearShown();
    restart();
  });
  $('settings-form').addEventListener('submit', (e) => {
    e.preventDefault();
    offeredToken = '';
    token = $('token').value.trim();
    responderName = $('responder').value.trim();
    storageSet(TOKEN_KEY, token);
    storageSet(NAME_KEY, responderName);
    lastTokenAsk = '';
    $('settings-reason').textContent = 'Checking…';
    $('settings-reason').hidden = false;
    restart(true);
  });
  settings.addEventListener('keydown', (e) => {
    if (e.key === 'Escape') { closeSettings(); $('settings-toggle').focus(); }
  });

  /** After a token check succeeded: close the settings if they were opened for it. */
  function tokenWorks() {
    if (!settings.hidden && $('settings-reason').textContent === 'Checking…') closeSettings();
    lastTokenAsk = '';
  }

  /** After a token check failed other than by 401 (e.g. 403): say so where it was asked. */
  function tokenFailed(text) {
    if (!settings.hidden && $('settings-reason').textContent === 'Checking…') {
      $('settings-reason').textContent = text;
    }
  }

  // ---------------------------------------------------------------------------------------
  // Connection indicator

  const CONN = {
    idle: '',
    connecting: 'Connecting…',
    live: 'Live',
    reconnecting: 'Reconnecting…',
    offline: 'Offline: retrying',
    refused: 'Live updates unavailable (the API answers): retrying',
    locked: 'Needs a token',
    ended: 'Run ended',
  };
  function setConn(state) {
    const c = $('conn');
    c.dataset.state = state;
    c.textContent = CONN[state] || '';
  }

  // ---------------------------------------------------------------------------------------
  // Question cards (shared by the inbox and the run page)

  const TYPE_NAMES = {
    TOOL_APPROVAL: 'Tool approval',
    MISSING_INFO: 'Missing information',
    USER_CONFIRMATION: 'Confirmation',
    USER_CHOICE: 'Choice',
    USER_INPUT: 'Question',
    CUSTOM: 'Question',
  };

  function isSensitive(q) { return Boolean(q.sensitive) || q.input_type === 'password'; }
  function ctx(q) { return (q && typeof q.context === 'object' && q.context) || {}; }
  function optionOf(q, id) { return (q.options || []).find((o) => o.option_id === id); }
  function needsText(o) { return Boolean(o.requires_input || o.input_prompt); }

  /** A text field for an answer: a password box for sensitive questions, else a textarea where
   * Enter sends (Shift+Enter is a new line). */
  function answerField(q, id, labelText, required) {
    const sensitive = isSensitive(q);
    const label = el('label', { for: id, text: labelText });
    const input = sensitive
      ? el('input', { id, type: 'password', autocomplete: 'off', spellcheck: 'false', name: 'input' })
      : el('textarea', { id, rows: '2', name: 'input', spellcheck: 'true' });
    if (required) input.required = true;
    if (!sensitive) {
      input.addEventListener('keydown', (e) => {
        if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
          e.preventDefault();
          input.form && input.form.requestSubmit();
        }
      });
    }
    const hint = el('p', {
      class: 'hint',
      text: sensitive ? 'Hidden as you type; never shown again, here or anywhere.' : 'Enter sends · Shift+Enter starts a new line',
    });
    return { field: el('div', { class: 'field' }, label, input, hint), input };
  }

  // ---------------------------------------------------------------------------------------
  // Typed answers: a form from the request's `response_schema` (MCP elicitation's flat schema)

  function isTyped(q) {
    const s = q.response_schema;
    return Boolean(s && typeof s === 'object' && s.properties && typeof s.properties === 'object');
  }

  /** The choices of an enum property: [{value, title}], or null when it is none. */
  function choicesOf(p) {
    if (Array.isArray(p.oneOf)) return p.oneOf.map((c) => ({ value: String(c.const), title: c.title || String(c.const) }));
    if (Array.isArray(p.anyOf)) return p.anyOf.map((c) => ({ value: String(c.const), title: c.title || String(c.const) }));
    if (Array.isArray(p.enum)) {
      const names = Array.isArray(p.enumNames) ? p.enumNames : [];
      return p.enum.map((v, i) => ({ value: String(v), title: names[i] || String(v) }));
    }
    return null;
  }

  /** `2026-11-24T10:00:00Z` as a datetime-local value (local time, minutes). */
  function localDateTime(s) {
    const t = Date.parse(s);
    if (Number.isNaN(t)) return '';
    const d = new Date(t - new Date(t).getTimezoneOffset() * 60000);
    return d.toISOString().slice(0, 16);
  }

  /**
   * The form of a typed question: one control per field, in the order every UI asks them (the fields
   * listed in `required` first, as listed, then the others by name). Returns {node, inputs, read,
   * mark}: `inputs()` lists its controls (cleared after a sensitive answer is sent);
   * `read()` gives the `data` object, or null when a required field is empty (said at the
   * field); `mark(message)` flags the field a refusal names.
   */
  function typedForm(q, rid) {
    const schema = q.response_schema;
    const required = Array.isArray(schema.required) ? schema.required.map(String) : [];
    const names = Object.keys(schema.properties).sort((a, b) => {
      const ia = required.indexOf(a); const ib = required.indexOf(b);
      if (ia !== ib) return (ia < 0 ? Infinity : ia) - (ib < 0 ? Infinity : ib) || (a < b ? -1 : 1);
      return a < b ? -1 : a > b ? 1 : 0;
    });
    // A control carries its property's name in `data-field`, never as `name`: a form's named
    // controls shadow the form's own methods and properties (a property `addEventListener` or
    // `querySelectorAll` would break the card, and the listing with it), and the schema's names
    // are the agent's.
    const node = el('div', { class: 'typed-form' });
    const fields = [];
    names.forEach((name, index) => {
      const p = schema.properties[name] || {};
      const id = `f-${rid}-${index}`;
      const must = required.includes(name);
      const choices = p.type === 'array' ? choicesOf(p.items || {}) : choicesOf(p);
      const hintId = `${id}-hint`;
      const errId = `${id}-err`;
      const err = el('p', { id: errId, class: 'field-error', role: 'alert' });
      const labelText = [p.title || name, must ? el('span', { class: 'req', title: 'required', 'aria-hidden': 'true', text: ' *' }) : null];
      const hint = p.description ? el('p', { id: hintId, class: 'hint', text: p.description }) : null;
      const described = [p.description ? hintId : null, errId].filter(Boolean).join(' ');
      let control; let read; let wrap;
      if (p.type === 'boolean') {
        control = el('input', { id, type: 'checkbox', dataset: { field: name }, 'aria-describedby': described });
        control.checked = p.default === true;
        read = () => control.checked;
        wrap = el('div', { class: 'field field-check' }, el('label', { for: id }, control, ' ', ...labelText), hint, err);
      } else if (p.type === 'array') {
        const boxes = (choices || []).map((c, i) => {
          const box = el('input', { id: `${id}-${i}`, type: 'checkbox', dataset: { field: name }, value: c.value });
          box.checked = Array.isArray(p.default) && p.default.map(String).includes(c.value);
          return { box, row: el('label', { for: `${id}-${i}`, class: 'choice' }, box, ' ', c.title) };
        });
        const bounds = [p.minItems !== undefined ? `at least ${p.minItems}` : null, p.maxItems !== undefined ? `at most ${p.maxItems}` : null].filter(Boolean).join(', ');
        wrap = el('fieldset', { class: 'field field-choices', 'aria-describedby': described },
          el('legend', { class: 'label' }, ...labelText), hint,
          bounds ? el('p', { class: 'hint', text: `Choose ${bounds}.` }) : null,
          ...boxes.map((b) => b.row), err);
        control = boxes.length ? boxes[0].box : wrap;
        read = () => {
          const picked = boxes.filter((b) => b.box.checked).map((b) => b.box.value);
          return picked.length || must ? picked : undefined;
        };
      } else if (choices) {
        control = el('select', { id, dataset: { field: name }, 'aria-describedby': described },
          el('option', { value: '', text: must ? 'Choose…' : '(none)' }),
          ...choices.map((c) => el('option', { value: c.value, text: c.title })));
        if (p.default !== undefined) control.value = String(p.default);
        read = () => control.value === '' ? undefined : control.value;
      } else if (p.type === 'number' || p.type === 'integer') {
        control = el('input', {
          id, dataset: { field: name }, type: 'number', inputmode: p.type === 'integer' ? 'numeric' : 'decimal',
          step: p.type === 'integer' ? '1' : 'any', min: p.minimum, max: p.maximum, 'aria-describedby': described,
        });
        if (p.default !== undefined) control.value = String(p.default);
        read = () => {
          const v = control.value.trim();
          if (v === '') return undefined;
          const n = Number(v);
          return Number.isFinite(n) ? n : v;
        };
      } else {
        const kinds = { email: 'email', uri: 'url', date: 'date', 'date-time': 'datetime-local' };
        const type = isSensitive(q) ? 'password' : (kinds[p.format] || 'text');
        control = el('input', {
          id, dataset: { field: name }, type, autocomplete: 'off', minlength: p.minLength, maxlength: p.maxLength,
          'aria-describedby': described,
        });
        if (typeof p.default === 'string') control.value = p.format === 'date-time' ? localDateTime(p.default) : p.default;
        read = () => {
          const v = control.value;
          if (v === '') return undefined;
          if (p.format === 'date-time') {
            const t = Date.parse(v);
            return Number.isNaN(t) ? v : new Date(t).toISOString();
          }
          return v;
        };
      }
      if (!wrap) {
        // What the field takes, when the schema bounds it.
        const range = (lo, hi, unit) => (lo !== undefined && hi !== undefined ? `From ${lo} to ${hi}${unit}.`
          : lo !== undefined ? `At least ${lo}${unit}.` : hi !== undefined ? `At most ${hi}${unit}.` : '');
        const bounds = (p.type === 'number' || p.type === 'integer')
          ? range(p.minimum, p.maximum, '')
          : choices ? '' : range(p.minLength, p.maxLength, ' characters');
        wrap = el('div', { class: 'field' }, el('label', { for: id }, ...labelText), control, hint,
          bounds ? el('p', { class: 'hint', text: bounds }) : null, err);
      }
      if (must && control instanceof HTMLInputElement && control.type !== 'checkbox') control.required = true;
      if (must && control instanceof HTMLSelectElement) control.required = true;
      fields.push({ name, must, control, err, read, wrap });
      node.append(wrap);
    });
    const flag = (f, text) => {
      f.err.textContent = text;
      f.control.setAttribute('aria-invalid', 'true');
      f.control.focus();
    };
    return {
      node,
      inputs: () => fields.map((f) => f.control),
      read() {
        const data = {};
        for (const f of fields) {
          f.err.textContent = '';
          f.control.removeAttribute('aria-invalid');
        }
        for (const f of fields) {
          const v = f.read();
          if (v === undefined) {
            if (f.must) { flag(f, 'Required.'); return null; }
            continue;
          }
          data[f.name] = v;
        }
        return data;
      },
      /** Flags the field a refusal names (`field \`email\`: …`). */
      mark(message) {
        const m = /field `([^`]+)`/.exec(message || '');
        const f = m && fields.find((x) => x.name === m[1]);
        if (f) flag(f, message.slice(message.indexOf(m[0]) + m[0].length + 1).trim());
      },
    };
  }

  // A card answers only once it has stood still on the screen for ARM_MS: a card inserted or
  // removed above it, a question replaced in the same place on the run page, or a confirmation
  // step just opened would otherwise put another question's button under a click already on its
  // way, or under a held or repeated key. An answer tried sooner is not sent; the card says why
  // (docs/inbox.md). Cards carry `data-armed` once they answer (for tests and styles).
  const ARM_MS = 700;
  let stillSince = 0;
  let armTimer = null;
  function armCards() {
    const now = performance.now();
    let next = Infinity;
    for (const n of document.querySelectorAll('article[data-request-id]')) {
      const at = Math.max(stillSince, Number(n.dataset.shownAt || 0)) + ARM_MS;
      if (now >= at) n.dataset.armed = '';
      else { delete n.dataset.armed; next = Math.min(next, at); }
    }
    clearTimeout(armTimer);
    if (next !== Infinity) armTimer = setTimeout(armCards, next - now + 10);
  }
  /** The cards moved (one came, went, or grew): none answers for ARM_MS. */
  function cardsMoved() {
    stillSince = performance.now();
    armCards();
  }
  /** `node`'s card is new, or just changed under the person (a confirmation step opened). */
  function cardShown(node) {
    node.dataset.shownAt = String(performance.now());
    armCards();
  }
  /** Whether `node`'s card answers now: `data-armed`, which `armCards` keeps. */
  function armed(node) {
    return 'armed' in node.dataset;
  }

  /**
   * One question as a card. `place` is 'inbox' or 'run'. Returns the card object: {q, node,
   * settled, ...}. The node carries `data-request-id`; option buttons `data-option-id`.
   */
  /** "Always allow": an approval of a grantable tool may also approve later calls like it
   * (`data.grant`, docs/inbox.md). Off unless ticked; the scope is this run or the agent. */
  function makeGrantBox(q) {
    const id = `grant-${q.request_id}`;
    const box = el('input', { type: 'checkbox', id, name: 'grant' });
    const scope = el('select', { id: `${id}-scope`, name: 'grant-scope', disabled: true, 'aria-label': 'Which runs' },
      el('option', { value: 'run', text: 'in this run' }),
      el('option', { value: 'agent', text: `in every run of ${q.agent}` }));
    box.addEventListener('change', () => { scope.disabled = !box.checked; });
    const node = el('div', { class: 'grant-box' },
      el('label', { for: id, class: 'grant-label' }, box, ' Always allow: also approve later calls with these arguments '),
      scope,
      el('p', { class: 'hint', text: 'Sent only with an approval. Grants are listed under “Grants” below, where they can be revoked.' }));
    return {
      node,
      read() { return box.checked ? { scope: scope.value } : null; },
    };
  }

  // ---------------------------------------------------------------------------------------
  // Grants: `GET /v1/grants` (active ones), each with a revoke button (`DELETE /v1/grants/<id>`)

  function describeArgs(args) {
    const parts = Object.entries(args || {}).map(([k, m]) => {
      if (m === 'absent') return `${k} absent`;
      if (m && typeof m === 'object' && 'exact' in m) return `${k} = ${JSON.stringify(m.exact)}`;
      if (m && typeof m === 'object' && 'regex' in m) return `${k} ~ /${m.regex}/`;
      return k;
    });
    return parts.length ? parts.join(', ') : 'any arguments';
  }

  function grantRow(g) {
    const uses = g.max_uses ? `${g.uses} of ${g.max_uses} uses` : `${g.uses} use${g.uses === 1 ? '' : 's'}`;
    const where = g.scope === 'agent' ? `every run of ${g.agent}` : `run ${shortId(g.run_id)}`;
    const note = el('p', { class: 'grant-note', role: 'alert' });
    const revoke = el('button', { type: 'button', class: 'btn btn-small btn-danger', dataset: { grantId: g.grant_id }, text: 'Revoke' });
    const row = el('li', { class: 'grant', dataset: { grantId: g.grant_id } },
      el('div', { class: 'grant-main' },
        el('code', { class: 'chip', text: g.tool }),
        el('span', { class: 'grant-args', text: describeArgs(g.args) })),
      el('div', { class: 'grant-meta', text: `${where} · by ${g.created_by.id} (${g.created_by.via}) · ${uses}${g.expires_at ? ` · until ${when(parseTime(g.expires_at))}` : ''}` }),
      el('div', { class: 'actions' }, revoke),
      note);
    revoke.addEventListener('click', async () => {
      revoke.disabled = true;
      note.textContent = 'Revoking…';
      try {
        await api('DELETE', `/v1/grants/${encodeURIComponent(g.grant_id)}`);
        toast(`Grant for ${g.tool} revoked: it approves nothing from now on.`);
        loadGrants();
      } catch (err) {
        revoke.disabled = false;
        note.textContent = err.status === 403 ? `Not allowed: ${err.message}` : `Not revoked: ${err.message}`;
      }
    });
    return row;
  }

  /** The grant of an approval is made by the worker as it applies the answer: the list is
   * read again until it shows up (for up to 20 s). */
  function awaitGrant(rid, tries = 20) {
    loadGrants().then((grants) => {
      if (tries > 1 && !(grants || []).some((g) => g.grant_id === rid)) {
        setTimeout(() => awaitGrant(rid, tries - 1), 1000);
      }
    });
  }

  async function loadGrants() {
    const section = $('grants-view');
    if (!section) return;
    let list;
    try {
      list = await api('GET', '/v1/grants');
    } catch (err) {
      // Without the answer role there is nothing to show: the section stays hidden.
      section.hidden = true;
      return null;
    }
    const grants = list.grants || [];
    section.hidden = false;
    $('grants-empty').hidden = grants.length > 0;
    $('grants').replaceChildren(...grants.map(grantRow));
    return grants;
  }

  function makeCard(q, place, onDone) {
    const card = { q, node: null, settled: false, busy: false, sent: false, addedAt: Date.now() };
    const rid = q.request_id;
    const c = ctx(q);
    const sensitive = isSensitive(q);
    const created = parseTime(q.timestamp);
    const expires = parseTime(q.expires_at);
    const def = q.default_option_id ? optionOf(q, q.default_option_id) : null;
    const isPlan = Array.isArray(c.plan);
    const typeName = isPlan ? 'Plan confirmation' : (TYPE_NAMES[q.type] || 'Question');
    const headingId = `h-${rid}`;

    // Head: type, agent, run, age, time left.
    const deadline = el('span', { class: 'deadline' });
    if (!Number.isNaN(expires)) {
      deadline.dataset.until = String(expires);
      deadline.dataset.then = def ? `then “${def.label}” applies` : 'then the run fails';
    } else {
      deadline.textContent = 'No deadline';
    }
    const head = el('div', { class: 'card-head' },
      el('span', { class: `type type-${String(q.type || '').toLowerCase()}`, text: typeName }),
      el('span', { class: 'agent', title: 'Agent', text: q.agent }),
      place === 'inbox'
        ? el('a', { class: 'run-link', href: `/runs/${encodeURIComponent(q.run_id)}`, text: `run ${shortId(q.run_id)}`, title: `Run ${q.run_id}` })
        : null,
      el('span', { class: 'age', dataset: { since: String(created) }, title: clock(created) }),
      deadline);

    const body = [];
    body.push(el('h2', { id: headingId, class: 'title', text: q.title || q.prompt }));
    if (q.title) body.push(el('p', { class: 'prompt', text: q.prompt }));
    if (isPlan) {
      if (c.round && c.max_rounds > 1 && c.round >= c.max_rounds) {
        body.push(el('p', { class: 'meta', text: 'This is the last round: the plan can be confirmed or cancelled.' }));
      }
      const list = el('ol', { class: 'plan' });
      for (const t of c.plan) {
        const task = (t && typeof t === 'object') ? t : { description: String(t) };
        list.append(el('li', {},
          el('span', { class: 'plan-desc', text: task.description || '' }),
          task.tool ? el('span', { class: 'chip', text: visible(task.tool) }) : null,
          task.risk ? el('span', { class: `chip ${riskClass(task.risk)}`, text: `risk ${task.risk}` }) : null));
      }
      body.push(list);
    } else if (q.details) {
      body.push(el('p', { class: 'details', text: q.details }));
    }

    // A tool call: what would run, with its arguments (editable when approving allows it).
    let argsEditor = null;
    let grantBox = null;
    if (q.type === 'TOOL_APPROVAL' && (c.tool || c.args !== undefined)) {
      const facts = el('dl', { class: 'tool-facts' });
      const fact = (k, v, cls) => {
        if (v === undefined || v === null || v === '') return;
        facts.append(el('dt', { text: k }), el('dd', { class: cls }, v));
      };
      fact('Tool', c.tool ? el('code', { text: visible(c.tool) }) : null);
      fact('Command', c.command_line ? el('code', { class: 'wrap', text: visible(c.command_line) }) : null);
      fact('Risk', c.risk_level ? el('span', { class: `chip ${riskClass(c.risk_level)}`, text: c.risk_level }) : null);
      fact('Policy', c.policy_rule ? `asked because of rule “${c.policy_rule}” (policy.yaml)` : null);
      body.push(facts);
      const argsId = `args-${rid}`;
      const shown = el('pre', { class: 'args', id: `${argsId}-view`, tabindex: '0', 'aria-label': 'Arguments' }, pretty(c.args ?? {}));
      const canEdit = c.args && typeof c.args === 'object' && !Array.isArray(c.args)
        && (q.options || []).some((o) => o.action === 'APPROVE_AND_EXECUTE');
      // A long list scrolls in its box: said, so that no key is left below the fold unread.
      const lines = pretty(c.args ?? {}).split('\n').length;
      const argsBlock = el('div', { class: 'args-block' },
        el('div', { class: 'args-head' }, el('span', { class: 'label', text: 'Arguments' })), shown,
        lines > 14 ? el('p', { class: 'hint', text: `${lines} lines: scroll the box to read them all.` }) : null);
      if (canEdit) {
        const area = el('textarea', { id: argsId, class: 'args-edit', rows: '6', spellcheck: 'false', name: 'args', 'aria-describedby': `${argsId}-err` });
        area.value = pretty(c.args);
        const areaLabel = el('label', { for: argsId, class: 'label', text: 'Arguments (JSON, sent with an approval)' });
        const err = el('p', { id: `${argsId}-err`, class: 'field-error', role: 'alert' });
        const editWrap = el('div', { class: 'args-editor', hidden: true }, areaLabel, area, err);
        const toggle = el('button', { type: 'button', class: 'btn btn-small', 'aria-expanded': 'false', 'aria-controls': `${argsId}-editor`, text: 'Edit arguments' });
        editWrap.id = `${argsId}-editor`;
        toggle.addEventListener('click', () => {
          const open = editWrap.hidden;
          editWrap.hidden = !open;
          shown.hidden = open;
          toggle.textContent = open ? 'Keep original arguments' : 'Edit arguments';
          toggle.setAttribute('aria-expanded', String(open));
          if (open) area.focus(); else { area.value = pretty(c.args); err.textContent = ''; }
        });
        argsBlock.querySelector('.args-head').append(toggle);
        argsBlock.append(editWrap);
        argsEditor = {
          /** The edited arguments: undefined when not edited, null (with the error shown)
           * when they are not a JSON object. */
          read() {
            if (editWrap.hidden) return undefined;
            const v = parseJson(area.value);
            if (!v || typeof v !== 'object' || Array.isArray(v)) {
              err.textContent = 'The arguments must be a JSON object, e.g. {"name": "value"}. Fix them or keep the original arguments.';
              area.setAttribute('aria-invalid', 'true');
              area.focus();
              return null;
            }
            err.textContent = '';
            area.removeAttribute('aria-invalid');
            return JSON.stringify(v) === JSON.stringify(c.args) ? undefined : v;
          },
        };
      }
      body.push(argsBlock);
      if (c.grantable === true && !c.may_have_run && !sensitive) grantBox = makeGrantBox(q);
      if (grantBox) body.push(grantBox.node);
    }

    // Who holds a claim on it, where its votes stand, and a button to claim it or give it back:
    // after the answer's controls, so the keyboard reaches the options first.
    const human = humanBlock(q, card, () => setOutcome('', 'info'), (text) => setOutcome(text, 'error'));

    const outcome = el('p', { class: 'outcome', role: 'alert', hidden: true, tabindex: '-1' });
    const form = el('form', { class: 'answer', novalidate: true, 'aria-labelledby': headingId });
    const typed = isTyped(q) ? typedForm(q, rid) : null;

    function setOutcome(text, kind, ...extra) {
      outcome.replaceChildren(text, ...extra);
      outcome.className = `outcome outcome-${kind}`;
      outcome.hidden = !text && !extra.length;
    }

    function controls() { return form.querySelectorAll('button, input, textarea, select'); }
    function setBusy(busy) {
      card.busy = busy;
      form.setAttribute('aria-busy', String(busy));
      for (const c2 of controls()) c2.disabled = busy || card.settled;
    }

    /** Ends the card: it can no longer be answered from here. */
    function settle(kind, text, ...extra) {
      // The focus was in the card (on the button just used, now disabled): it goes to what
      // became of the answer, not to the page's start.
      const hadFocus = card.node.contains(document.activeElement)
        || (card.focusWasIn && document.activeElement === document.body);
      card.settled = true;
      card.node.classList.add('settled', `settled-${kind}`);
      for (const c2 of card.node.querySelectorAll('button, input, textarea, select')) c2.disabled = true;
      setOutcome(text, kind, ...extra);
      if (hadFocus) outcome.focus();
      if (kind !== 'ok') {
        const dismiss = el('button', { type: 'button', class: 'btn btn-small dismiss', text: 'Dismiss' });
        dismiss.addEventListener('click', () => onDone(card, 'dismissed'));
        outcome.append(' ', dismiss);
        dismiss.focus();
        onDone(card, 'refused');
      }
    }

    async function send(answer, fields) {
      if (card.busy || card.settled) return;
      if (!armed(card.node)) {
        setOutcome('This question just appeared or moved on the page: check it is the one you mean, then answer again.', 'info');
        return;
      }
      const bodyOut = { ...answer };
      if (!token && responderName && !answerLink) bodyOut.responder = { id: responderName };
      // What was shown: an answer to another version of the question is refused (409 stale).
      if (q.request_hash) bodyOut.request_hash = q.request_hash;
      // A sensitive answer leaves the page now: it is never kept or shown again.
      if (sensitive) for (const f of fields || []) f.value = '';
      // Disabled while it is sent, the control in use loses the focus: remembered, for settle.
      card.focusWasIn = card.node.contains(document.activeElement);
      setBusy(true);
      setOutcome('Sending…', 'info');
      try {
        const reply = await api('POST', `/v1/interactions/${encodeURIComponent(rid)}/response`, bodyOut);
        card.sent = true;
        if (reply && reply.tally) card.setHuman({ claim: null, tally: reply.tally });
        if (reply && reply.status === 'counted') {
          settle('ok', `Your vote is counted: ${tallyText(reply.tally)}. The question waits for more votes.`);
        } else {
          settle('ok', 'Answer sent: the run resumes.');
        }
        onDone(card, 'sent');
      } catch (err) {
        setBusy(false);
        await refusal(err);
      }
    }

    async function refusal(err) {
      switch (err.status) {
        case 401:
          setOutcome('Not signed in: enter a token (top right), then answer again.', 'error');
          return;
        case 403:
          settle('error', `Not allowed: ${err.message}`);
          return;
        case 404:
          settle('error', 'This question no longer exists.');
          return;
        case 410:
          settle('error', 'Expired: the deadline passed, so its default was applied (or the run failed).');
          return;
        case 409: {
          if (err.code === 'claimed') {
            // Someone else is on it: the card stays, and says who until when.
            setOutcome(`Claimed: ${err.message}`, 'error');
            card.refreshHuman();
            return;
          }
          if (err.code === 'stale') {
            settle('error', 'This question changed since it was shown here: reload the page to see it as it is now.');
            return;
          }
          if (err.code === 'already_voted') {
            settle('error', `Not counted: ${err.message}`);
            return;
          }
          const since = el('span', { class: 'ago' });
          let text = 'Already answered elsewhere.';
          try {
            const ix = await api('GET', `/v1/interactions/${encodeURIComponent(rid)}`);
            const who = ix.response && ix.response.responder;
            const at = parseTime(ix.answered_at);
            if (ix.state === 'ANSWERED' && who) {
              text = `Already answered by ${who.id} (${who.via})`;
              if (!Number.isNaN(at)) { since.dataset.since = String(at); since.textContent = ` ${ago(at)}`; }
            } else if (ix.state === 'CANCELLED') {
              text = 'Closed: its run was cancelled.';
            } else if (ix.state === 'EXPIRED') {
              text = 'Expired: the deadline passed, so its default was applied (or the run failed).';
            }
          } catch (_) {
            text = err.message;
          }
          settle('error', text, since, '.');
          return;
        }
        case 422:
        case 400:
        case 413:
          setOutcome(`Not accepted: ${err.message}`, 'error');
          if (typed) typed.mark(err.message);
          return;
        default:
          setOutcome(err.status === 0 ? err.message : `The gateway could not take the answer (${err.message}). Try again.`, 'error');
      }
    }

    if (typed) {
      // A typed answer: a form, sent as `data`.
      const submit = el('button', { type: 'submit', class: 'btn btn-primary', text: 'Send answer' });
      form.append(typed.node, el('div', { class: 'actions' }, submit));
      form.addEventListener('submit', (e) => {
        e.preventDefault();
        const data = typed.read();
        if (!data) { setOutcome('Fill in the required fields first.', 'error'); return; }
        send({ data }, sensitive ? typed.inputs() : []);
      });
    } else if (!(q.options || []).length) {
      // Free text.
      const { field, input } = answerField(q, `in-${rid}`, sensitive ? 'Your answer (hidden)' : 'Your answer', true);
      const submit = el('button', { type: 'submit', class: 'btn btn-primary', text: 'Send answer' });
      form.append(field, el('div', { class: 'actions' }, submit));
      form.addEventListener('submit', (e) => {
        e.preventDefault();
        if (!input.value.trim()) {
          setOutcome('Type an answer first.', 'error');
          input.focus();
          return;
        }
        send({ input: input.value }, [input]);
      });
    } else {
      // Options: safe ones first, dangerous ones apart and confirmed in a second step.
      const safe = el('div', { class: 'options', role: 'group', 'aria-label': 'Options' });
      const risky = el('div', { class: 'options options-danger', role: 'group', 'aria-labelledby': `dz-${rid}` },
        el('p', { id: `dz-${rid}`, class: 'danger-title', text: 'Dangerous: asks you to confirm' }));
      const step = el('div', { class: 'step', hidden: true });
      let stepFor = null;

      const markChosen = (o) => {
        for (const b of form.querySelectorAll('.option')) {
          const on = Boolean(o) && b.dataset.optionId === o.option_id;
          b.classList.toggle('chosen', on);
          if (b.dataset.step) b.setAttribute('aria-expanded', String(on));
        }
      };

      const closeStep = () => {
        const back = stepFor && form.querySelector(`[data-option-id="${CSS.escape(stepFor.option_id)}"]`);
        markChosen(null);
        step.hidden = true;
        step.replaceChildren();
        stepFor = null;
        if (back) back.focus();
      };

      const answerWith = (o, text, fields) => {
        const answer = { option_id: o.option_id };
        if (text !== undefined && text.trim()) answer.input = text;
        if (argsEditor && o.action === 'APPROVE_AND_EXECUTE') {
          const edited = argsEditor.read();
          if (edited === null) return;
          if (edited !== undefined) answer.data = { args: edited };
        }
        const grant = grantBox && o.action === 'APPROVE_AND_EXECUTE' ? grantBox.read() : null;
        if (grant) answer.data = { ...(answer.data || {}), grant };
        send(answer, fields).then(() => { if (grant && card.sent) awaitGrant(rid); });
      };

      const openStep = (o, index) => {
        stepFor = o;
        markChosen(o);
        const parts = [el('p', { class: 'step-title', text: o.is_dangerous ? `Confirm: ${o.label}` : o.label })];
        if (o.description) parts.push(el('p', { class: 'hint', text: o.description }));
        // What a confirmed approval does, said where it is confirmed: the command, whether the
        // arguments are the edited ones, and a grant's reach.
        if (o.action === 'APPROVE_AND_EXECUTE' && c.command_line) {
          const edited = argsEditor ? argsEditor.read() : undefined;
          parts.push(edited
            ? el('p', { class: 'hint' }, 'Runs with the arguments as you edited them: ',
              el('code', { class: 'wrap', text: pretty(edited) }))
            : el('p', { class: 'hint' }, 'Runs: ', el('code', { class: 'wrap', text: visible(c.command_line) })));
          const grant = grantBox ? grantBox.read() : null;
          if (grant) {
            parts.push(el('p', { class: 'warning', text: grant.scope === 'agent'
              ? `And makes a grant: later calls like it in every run of ${q.agent} are approved without asking, until it is revoked under “Grants”.`
              : 'And makes a grant: later calls like it in this run are approved without asking, until it is revoked under “Grants”.' }));
          }
        }
        if (o.is_dangerous) parts.push(el('p', { class: 'warning', text: 'This option is marked dangerous. Make sure before you go on.' }));
        let input = null;
        if (needsText(o)) {
          const f = answerField(q, `in-${rid}-${index}`, o.input_prompt || 'Your text', Boolean(o.requires_input));
          input = f.input;
          parts.push(f.field);
        }
        const go = el('button', {
          type: 'submit',
          class: o.is_dangerous ? 'btn btn-danger' : 'btn btn-primary',
          dataset: { confirm: o.option_id },
          text: o.is_dangerous ? `Yes, ${o.label.charAt(0).toLowerCase()}${o.label.slice(1)}` : `Send “${o.label}”`,
        });
        const back = el('button', { type: 'button', class: 'btn', text: 'Back' });
        back.addEventListener('click', closeStep);
        parts.push(el('div', { class: 'actions' }, go, back));
        step.replaceChildren(...parts);
        step.hidden = false;
        cardShown(card.node);
        // The focus goes to the text to type, or to "Yes" for a Tab-free confirmation: either
        // way the step answers only after ARM_MS, so a key held down or pressed twice in a
        // hurry does not confirm what it opened.
        (input || go).focus();
      };

      form.addEventListener('submit', (e) => {
        e.preventDefault();
        if (!stepFor) return;
        const o = stepFor;
        const input = step.querySelector('[name="input"]');
        if (input && o.requires_input && !input.value.trim()) {
          setOutcome(`“${o.label}” needs text: ${o.input_prompt || 'type it first'}.`, 'error');
          input.focus();
          return;
        }
        answerWith(o, input ? input.value : undefined, input ? [input] : []);
      });
      step.addEventListener('keydown', (e) => {
        if (e.key === 'Escape') { e.stopPropagation(); closeStep(); }
      });

      q.options.forEach((o, index) => {
        const isDefault = o.option_id === q.default_option_id;
        const b = el('button', {
          type: 'button',
          class: o.is_dangerous ? 'btn option option-danger' : 'btn option',
          dataset: { optionId: o.option_id, step: (o.is_dangerous || needsText(o)) ? 'yes' : undefined },
          'aria-expanded': (o.is_dangerous || needsText(o)) ? 'false' : undefined,
          'aria-describedby': o.description ? `d-${rid}-${index}` : undefined,
        },
        el('span', { class: 'option-label' }, o.label,
          isDefault ? el('span', { class: 'chip chip-default', text: 'default' }) : null),
        o.description ? el('span', { class: 'option-desc', id: `d-${rid}-${index}`, text: o.description }) : null);
        b.addEventListener('click', () => {
          setOutcome('', 'info');
          if (o.is_dangerous || needsText(o)) openStep(o, index);
          else { step.hidden = true; stepFor = null; markChosen(o); answerWith(o, undefined, []); }
        });
        (o.is_dangerous ? risky : safe).append(b);
      });
      form.append(safe);
      if (risky.childElementCount > 1) form.append(risky);
      form.append(step);
    }

    card.node = el('article', {
      class: `card${sensitive ? ' card-sensitive' : ''}`,
      dataset: { requestId: rid, runId: q.run_id, shownAt: String(performance.now()) },
      'aria-labelledby': headingId,
      tabindex: '-1',
    }, head, ...body, form, human.node, outcome);
    setTimeout(armCards, ARM_MS + 10);
    card.settle = settle;
    card.setHuman = human.set;
    card.refreshHuman = human.refresh;
    return card;
  }

  /** "1 of 2 approvals (alice), 1 rejected (bob)". */
  function tallyText(t) {
    if (!t) return '';
    let s = `${t.approvals} of ${t.needed} approvals`;
    if ((t.approved_by || []).length) s += ` (${t.approved_by.join(', ')})`;
    if (t.rejections) s += `, ${t.rejections} rejected (${(t.rejected_by || []).join(', ')})`;
    return s;
  }

  /**
   * The part of a card about people rather than the question: the approvals it needs, where
   * its votes stand, who holds a claim on it until when, and a Claim / Release button.
   * `set({claim, tally})` shows a view's or an `updated` event's state.
   */
  function humanBlock(q, card, cleared, failed) {
    const rid = q.request_id;
    const rule = q.approvals
      ? el('p', { class: 'rule', text: `Needs ${q.approvals.min} approval${q.approvals.min === 1 ? '' : 's'}`
        + ((q.approvals.of || []).length ? ` from ${q.approvals.of.join(', ')}` : '')
        + (q.approvals.veto ? '; one rejection decides' : '')
        + (q.approvals.exclude_requester === false ? '' : '; not by whoever submitted the run') })
      : null;
    const votes = el('p', { class: 'votes', hidden: true });
    const claimLine = el('p', { class: 'claim', hidden: true });
    const button = el('button', { type: 'button', class: 'btn btn-small claim-btn', text: 'Claim' });
    const state = { claim: null, tally: null };
    const me = () => token ? null : (responderName || null);

    function set(s) {
      if (s.tally !== undefined && s.tally !== null) state.tally = s.tally;
      if (s.claim !== undefined) state.claim = s.claim;
      votes.hidden = !state.tally;
      votes.textContent = state.tally ? `Votes: ${tallyText(state.tally)}` : '';
      const c = state.claim;
      const until = c ? parseTime(c.until) : NaN;
      const live = c && !(until < Date.now());
      claimLine.hidden = !live;
      if (live) {
        claimLine.replaceChildren(`Claimed by ${c.by} until ${clock(until)}`);
        claimLine.dataset.by = c.by;
      } else {
        delete claimLine.dataset.by;
      }
      const mine = live && card.claimedHere;
      button.textContent = mine ? 'Release' : 'Claim';
      button.dataset.action = mine ? 'release' : 'claim';
    }

    async function refresh() {
      try {
        const v = await api('GET', `/v1/interactions/${encodeURIComponent(rid)}`);
        set({ claim: v.claim, tally: v.tally });
      } catch (_) { /* the card's own calls say what is wrong */ }
    }

    button.addEventListener('click', async () => {
      const release = button.dataset.action === 'release';
      const body = release ? { release: true } : {};
      if (me()) body.responder = { id: me() };
      button.disabled = true;
      try {
        const r = await api('POST', `/v1/interactions/${encodeURIComponent(rid)}/claim`, body);
        card.claimedHere = !release && Boolean(r.claim);
        card.claimedBy = r.claim ? r.claim.by : null;
        set({ claim: r.claim });
        cleared();
      } catch (err) {
        failed(err.code === 'claimed' ? `Claimed: ${err.message}` : `Cannot claim it: ${err.message}`);
        refresh();
      } finally {
        button.disabled = card.settled;
      }
    });
    set({});
    const node = el('div', { class: 'human' }, rule, votes, claimLine, el('div', { class: 'claim-actions' }, button));
    return { node, set, refresh };
  }

  /** Refreshes every relative time and countdown on the page (once a second). */
  function tick() {
    const now = Date.now();
    for (const n of document.querySelectorAll('[data-since]')) {
      const t = Number(n.dataset.since);
      if (Number.isNaN(t)) continue;
      const text = n.classList.contains('age') ? `asked ${ago(t)}` : ` ${ago(t)}`;
      if (n.textContent !== text) n.textContent = text;
    }
    for (const n of document.querySelectorAll('[data-until]')) {
      const left = Number(n.dataset.until) - now;
      const text = left > 0 ? `${span(left)} left, ${n.dataset.then}` : `Deadline passed: ${n.dataset.then.replace(/^then /, '')}`;
      if (n.textContent !== text) n.textContent = text;
      n.classList.toggle('soon', left <= 60000);
    }
  }

  // ---------------------------------------------------------------------------------------
  // The inbox: `/`

  const inbox = {
    cards: new Map(), // request_id -> card
    gone: new Map(), // request_id -> when it was settled (a stale listing must not bring it back)
    stream: null,
    retry: 1000,
    timer: 0,
    attempt: 0, // each opening counts: a ticket that arrives for an older one is not used
    listings: 0, // each listing counts: one that finishes after a newer one is dropped
    lastId: 0, // the stream's last event id: a reconnect goes on from the next one
    resumes: 0, // streams opened from the last event seen (for tests)
    openedAt: 0, // when the stream last opened: one that drops soon after backs off
  };

  /** How long a stream must stay open before a drop counts as a blip (reconnect at once). */
  const STABLE_MS = 10000;

  function renderCount() {
    const n = [...inbox.cards.values()].filter((c) => !c.settled).length;
    $('count').textContent = n ? `${n} waiting` : '';
    $('empty').hidden = inbox.cards.size > 0 || !$('inbox-error').hidden;
    document.title = n ? `(${n}) Delta inbox` : 'Delta inbox';
  }

  function inboxDone(card, why) {
    const rid = card.q.request_id;
    inbox.gone.set(rid, Date.now());
    if (why === 'refused') {
      renderCount();
    } else if (why === 'sent') {
      setTimeout(() => { if (inbox.cards.get(rid) === card) removeCard(rid); }, 4000);
      renderCount();
    } else {
      removeCard(rid);
    }
  }

  /**
   * Shows question `q` (once). `view`, from a listing started at `listedAt`, brings its claim and
   * votes, unless a live `updated` event newer than that listing already did.
   */
  function addCard(q, view, listedAt) {
    if (!q || !q.request_id) return;
    const shown = inbox.cards.get(q.request_id);
    // The same question changed since it was shown (another version: its hash differs): shown
    // anew, saying so, rather than left to be answered as it was (the gateway would refuse that
    // answer as stale). Not while an answer to it is on its way.
    const changed = shown && !shown.settled && !shown.busy && q.request_hash
      && shown.q.request_hash && q.request_hash !== shown.q.request_hash
      && !(listedAt !== undefined && shown.addedAt > listedAt);
    if (shown && !shown.settled && !changed) {
      if (view && !(shown.humanAt > listedAt)) shown.setHuman({ claim: view.claim, tally: view.tally });
      return;
    }
    if (shown) removeCard(q.request_id); // asked again after an answer the engine refused
    const card = makeCard(q, 'inbox', inboxDone);
    if (changed) toast(`“${q.title || q.prompt}” changed since it was shown: read it again before you answer.`);
    if (view) card.setHuman({ claim: view.claim, tally: view.tally });
    const at = parseTime(q.timestamp);
    const list = $('cards');
    let before = null;
    for (const other of inbox.cards.values()) {
      const t = parseTime(other.q.timestamp);
      if (t > at && (!before || t < parseTime(before.q.timestamp))) before = other;
    }
    list.insertBefore(card.node, before ? before.node : null);
    inbox.cards.set(q.request_id, card);
    cardsMoved();
    tick();
    renderCount();
  }

  function removeCard(rid) {
    const card = inbox.cards.get(rid);
    if (!card) return;
    const hadFocus = card.node.contains(document.activeElement);
    const next = card.node.nextElementSibling || card.node.previousElementSibling;
    card.node.remove();
    inbox.cards.delete(rid);
    cardsMoved();
    // The focus goes to the next card itself, never into its controls: the keys the person
    // was pressing for the question that left must not answer one they have not read.
    if (hadFocus) (next || $('main')).focus();
    renderCount();
  }

  function describeResolved(r, q) {
    const who = r.responder ? `${r.responder.id} (${r.responder.via})` : 'someone';
    const option = r.option_id ? optionOf(q, r.option_id) : null;
    if (r.state === 'EXPIRED') return r.option_id ? `expired: its default “${option ? option.label : r.option_id}” applied` : 'expired: its run fails';
    if (r.state === 'CANCELLED') return `closed: its run was cancelled by ${r.responder ? r.responder.id : 'an operator'}`;
    return `answered by ${who}`;
  }

  function onResolved(r) {
    if (!r || !r.request_id) return;
    inbox.gone.set(r.request_id, Date.now());
    const card = inbox.cards.get(r.request_id);
    // Our own answer in flight: its reply says how it went (accepted, or who was first).
    if (!card || card.sent || card.busy) return;
    removeCard(r.request_id);
    toast(`“${card.q.title || card.q.prompt}” was ${describeResolved(r, card.q)}.`);
  }

  async function loadPending() {
    const started = Date.now();
    // Two listings may overlap (a restart, then the stream's open): only the latest applies.
    const generation = ++inbox.listings;
    const found = [];
    let cursor = null;
    let pages = 0;
    do {
      const qs = new URLSearchParams({ state: 'pending', limit: '100' });
      if (cursor) qs.set('cursor', cursor);
      const page = await api('GET', `/v1/interactions?${qs}`);
      found.push(...(page.interactions || []));
      cursor = page.next_cursor;
      pages += 1;
    } while (cursor && pages < 50);
    if (generation !== inbox.listings) return;
    tokenWorks();
    $('inbox-error').hidden = true;
    const ids = new Set(found.map((v) => v.request_id));
    // More than the pages read: said, and no card is taken for settled for missing from them.
    const cut = Boolean(cursor);
    if (cut) toast(`More than ${found.length} questions wait: the first ${found.length} are listed (the API or \`delta pending ls\` pages through all).`);
    for (const [rid, card] of inbox.cards) {
      // Settled while we were not listening; cards shown after this listing began stay.
      if (!cut && !ids.has(rid) && !card.settled && card.addedAt < started) removeCard(rid);
    }
    for (const v of found) {
      if (!inbox.gone.has(v.request_id) && v.request) addCard(v.request, v, started);
    }
    const old = Date.now() - 10 * 60 * 1000;
    for (const [rid, t] of inbox.gone) if (t < old) inbox.gone.delete(rid);
    renderCount();
  }

  function showInboxError(err) {
    const b = $('inbox-error');
    b.classList.toggle('banner-info', err.status === 401);
    if (err.status === 401) {
      // The token prompt says why; this says what is missing.
      b.textContent = 'Enter a token to see the questions waiting here.';
      b.hidden = false;
      $('empty').hidden = true;
      return;
    }
    b.textContent = err.status === 403
      ? `Not allowed to see questions: ${err.message}`
      : `Cannot load the questions: ${err.message}`;
    b.hidden = false;
    $('empty').hidden = true;
    tokenFailed(b.textContent);
  }

  /** After a stream failed (`err`: the ticket was refused): retry later, saying why in the
   * banner when the API refuses. */
  function inboxRetry(wasLive, err) {
    if (wasLive && Date.now() - inbox.openedAt >= STABLE_MS) {
      // It dropped after a while: connect again soon (with a new ticket), from the next event.
      inbox.retry = 1000;
      setConn('reconnecting');
      inbox.timer = setTimeout(openInboxStream, 500);
      return;
    }
    if (wasLive) {
      // It keeps dropping soon after it opens: back off, as for a refusal (each open would
      // otherwise ask for a ticket, and the gateway for its events, over and over).
      setConn('reconnecting');
      inbox.timer = setTimeout(openInboxStream, inbox.retry);
      inbox.retry = Math.min(inbox.retry * 2, 30000);
      return;
    }
    // Refused (401, 403, 503) or unreachable: the ticket's refusal, or else a plain call, says
    // why (the token prompt, a banner); the list is brought up to date when the stream opens.
    if (err && err.status === 401) {
      showInboxError(err); // the token prompt is open, and the header says a token is needed
    } else if (err) {
      setConn('offline');
      showInboxError(err);
    } else {
      setConn('offline');
      // The stream was refused after its ticket was taken (a 429 for this token's streams, a
      // 503 for the gateway's), which an EventSource cannot read: the API answering says so.
      api('GET', '/v1/interactions?state=pending&limit=1').then(() => {
        $('inbox-error').hidden = true;
        setConn('refused');
      }, showInboxError);
    }
    inbox.timer = setTimeout(openInboxStream, inbox.retry);
    inbox.retry = Math.min(inbox.retry * 2, 30000);
  }

  function openInboxStream() {
    clearTimeout(inbox.timer);
    if (inbox.stream) inbox.stream.close();
    inbox.stream = null;
    setConn('connecting');
    const attempt = ++inbox.attempt;
    // After a drop, from the event after the last one seen: nothing missed, nothing listed again.
    const path = inbox.lastId ? `/v1/interactions/stream?from_seq=${inbox.lastId + 1}` : '/v1/interactions/stream';
    const resumed = Boolean(inbox.lastId);
    withTicket(path, { stream: 'interactions' }).then((url) => {
      if (attempt === inbox.attempt) connectInbox(url, attempt, resumed);
    }, (err) => {
      if (attempt === inbox.attempt) inboxRetry(false, err);
    });
  }

  function connectInbox(url, attempt, resumed) {
    const es = new EventSource(url);
    inbox.stream = es;
    let live = false;
    es.addEventListener('open', () => {
      live = true;
      inbox.openedAt = Date.now();
      setConn('live');
      // Listed again whatever the stream brings: it goes on from the last event seen, but a
      // stream made anew (its ids started over) would bring nothing until it passed that id.
      // Cards already shown are kept; the back-off above keeps a flapping stream from listing
      // over and over.
      loadPending().catch(showInboxError);
      if (resumed) inbox.resumes += 1;
    });
    // Each event's id is its sequence in the events stream.
    for (const kind of ['requested', 'resolved', 'updated', 'escalated']) {
      es.addEventListener(kind, (e) => {
        const id = Number(e.lastEventId);
        if (Number.isSafeInteger(id) && id > inbox.lastId) inbox.lastId = id;
      });
    }
    es.addEventListener('requested', (e) => {
      const q = parseJson(e.data);
      if (!q || !q.request_id) return;
      inbox.gone.delete(q.request_id); // asked again (an answer the engine refused)
      addCard(q);
    });
    es.addEventListener('resolved', (e) => onResolved(parseJson(e.data)));
    es.addEventListener('updated', (e) => {
      // A claim taken, given back or broken, or a vote counted: the card shows it.
      const u = parseJson(e.data);
      const card = u && inbox.cards.get(u.request_id);
      if (!card || card.settled) return;
      card.humanAt = Date.now();
      // This page holds the claim only until someone else's change says otherwise.
      if (u.change !== 'voted' && !(u.change === 'claimed' && u.by === card.claimedBy)) card.claimedHere = false;
      card.setHuman({ claim: u.claim, tally: u.tally });
    });
    es.addEventListener('error', () => {
      // Never EventSource's own reconnect: it would present the spent ticket again.
      es.close();
      if (attempt !== inbox.attempt) return;
      inbox.stream = null;
      inboxRetry(live);
    });
  }

  function startInbox() {
    $('inbox-view').hidden = false;
    renderCount();
    $('empty').hidden = true;
    loadPending().then(renderCount, showInboxError);
    openInboxStream();
    $('grants-refresh').addEventListener('click', () => { loadGrants(); });
    loadGrants();
  }

  // ---------------------------------------------------------------------------------------
  // A run: `/runs/<run_id>`

  const run = { id: '', stream: null, lastSeq: 0, card: null, ended: false, timer: 0, retry: 1000, refreshTimer: 0, attempt: 0 };

  const STATUS_CLASS = {
    QUEUED: 'neutral', RUNNING: 'info', WAITING_FOR_INPUT: 'warn', INTERRUPTED: 'warn',
    COMPLETED: 'ok', FAILED: 'bad', CANCELLED: 'neutral',
  };

  function setRunStatus(status) {
    const s = $('run-status');
    s.textContent = status || '';
    s.className = `status status-${STATUS_CLASS[status] || 'neutral'}`;
    s.dataset.status = status || '';
  }

  function renderFacts(r) {
    const dl = $('run-facts');
    const rows = [];
    const row = (k, v, cls) => {
      if (v === undefined || v === null || v === '') return;
      rows.push(el('div', { class: 'fact' }, el('dt', { text: k }), el('dd', { class: cls, text: v })));
    };
    row('Agent', r.agent);
    row('Task', r.task);
    const created = parseTime(r.created_at);
    const updated = parseTime(r.updated_at);
    if (!Number.isNaN(created)) row('Started', `${new Date(created).toLocaleString()}`);
    if (!Number.isNaN(updated)) row('Updated', `${new Date(updated).toLocaleString()}`);
    row('Result', r.result, 'result');
    row('Error', r.error, 'error');
    dl.replaceChildren(...rows);
  }

  function runDone(card, why) {
    if (why === 'refused') return;
    if (why === 'sent') { scheduleRunRefresh(600); return; }
    card.node.remove();
    run.card = null;
  }

  async function refreshRun() {
    let r;
    try {
      r = await api('GET', `/v1/runs/${encodeURIComponent(run.id)}`);
    } catch (err) {
      const b = $('run-error');
      b.classList.toggle('banner-info', err.status === 401);
      if (err.status === 401) b.textContent = 'Enter a token to see this run.';
      else if (err.status === 404) {
        b.textContent = `There is no run ${run.id}.`;
        run.ended = true; // nothing to follow
        if (run.stream) run.stream.close();
        clearTimeout(run.timer);
        setConn('idle');
        $('journal-state').textContent = '';
      }
      else b.textContent = `Cannot load the run: ${err.message}`;
      b.hidden = false;
      if (err.status !== 401) tokenFailed(b.textContent);
      return;
    }
    tokenWorks();
    $('run-error').hidden = true;
    setRunStatus(r.status);
    renderFacts(r);
    const p = r.pending_interaction;
    const pending = p && p.state === 'PENDING' && p.request ? p.request : null;
    if (run.card && (!pending || run.card.q.request_id !== pending.request_id)) {
      if (!run.card.settled || run.card.sent) { run.card.node.remove(); run.card = null; }
    }
    if (run.card && pending && !run.card.settled) run.card.setHuman({ claim: p.claim, tally: p.tally });
    if (pending && !run.card) {
      run.card = makeCard(pending, 'run', runDone);
      run.card.setHuman({ claim: p.claim, tally: p.tally });
      $('run-question').replaceChildren(run.card.node);
      cardsMoved();
      tick();
    }
  }

  function scheduleRunRefresh(ms) {
    clearTimeout(run.refreshTimer);
    run.refreshTimer = setTimeout(refreshRun, ms);
  }

  /** "bob on behalf of alice", or "bob". */
  function responderLabel(r) {
    return r.on_behalf_of ? `${r.id} on behalf of ${r.on_behalf_of}` : String(r.id);
  }

  /** One line of the journal: what happened, in a few words. */
  function summary(e) {
    const p = e.payload || {};
    const cut = (s, n) => { const t = String(s ?? ''); return t.length > n ? `${t.slice(0, n - 1)}…` : t; };
    switch (e.type) {
      case 'ENGINE_START': return `worker ${p.worker ?? '?'}, attempt ${p.attempt ?? '?'}`;
      case 'THOUGHT': return cut(p.content, 300);
      case 'PLAN': return `${(p.tasks || []).length} task(s), risk ${p.risk_level ?? '?'}` + (p.round ? `, round ${p.round}` : '');
      case 'ACTION_REQUEST': return `${p.tool}(${cut(JSON.stringify(p.args ?? {}), 200)})`;
      case 'ACTION_RESULT': return `${p.status}${p.duration_ms !== undefined ? ` (${p.duration_ms} ms)` : ''}: ${cut(p.observation_content, 300)}`;
      case 'HUMAN_INPUT_REQUEST': return cut(p.prompt, 300);
      case 'HUMAN_INPUT_RECEIVED': {
        const who = p.responder ? `${responderLabel(p.responder)} via ${p.responder.via}` : 'someone';
        const parts = [];
        if (p.option_id) parts.push(`option ${p.option_id}`);
        if (p.input !== undefined) parts.push(`“${cut(p.input, 200)}”`);
        if (p.feedback) parts.push(`feedback “${cut(p.feedback, 200)}”`);
        if (p.edited_args) parts.push('edited arguments');
        return `from ${who}${parts.length ? `: ${parts.join(', ')}` : ''}`;
      }
      case 'HUMAN_VOTE': {
        const who = p.responder ? `${responderLabel(p.responder)} via ${p.responder.via}` : 'someone';
        return `${who} ${p.ballot === 'approve' ? 'approves' : 'rejects'} (option ${p.option_id})${p.feedback ? `: “${cut(p.feedback, 200)}”` : ''}`;
      }
      case 'ESCALATED': {
        const did = [];
        if (p.remind) did.push('reminded');
        if ((p.add_responders || []).length) did.push(`added ${p.add_responders.join(', ')}`);
        if (p.apply_default) did.push('applied the default');
        return `step ${p.step} of ${p.of} (after ${p.after})${did.length ? `: ${did.join(', ')}` : ''}`;
      }
      case 'SYSTEM_MESSAGE': return `${p.level ?? 'info'}: ${cut(p.content, 300)}`;
      case 'ENGINE_END': return `${p.status}${p.result ? `: ${cut(p.result, 300)}` : ''}${p.error ? `: ${cut(p.error, 300)}` : ''}`;
      default: return cut(JSON.stringify(p), 300);
    }
  }

  function appendJournal(e) {
    if (!e || typeof e.seq !== 'number' || e.seq <= run.lastSeq) return;
    run.lastSeq = e.seq;
    const t = parseTime(e.timestamp);
    const li = el('li', { class: `jl jl-${String(e.type || '').toLowerCase()}`, dataset: { seq: String(e.seq), type: e.type } },
      el('span', { class: 'jl-seq', text: e.seq }),
      el('time', { class: 'jl-time', datetime: e.timestamp, text: clock(t) }),
      el('span', { class: 'jl-type', text: e.type }),
      el('span', { class: 'jl-text', text: summary(e) }));
    $('journal').append(li);
    // What changes the question on show: a vote's tally and an escalation's responders too.
    if (['ENGINE_START', 'ENGINE_END', 'HUMAN_INPUT_REQUEST', 'HUMAN_INPUT_RECEIVED', 'HUMAN_VOTE', 'ESCALATED'].includes(e.type)) {
      scheduleRunRefresh(150);
    }
  }

  /** After the run's stream failed: open it again (a new ticket, from the next line on). */
  function runRetry(wasLive) {
    if (run.ended) return;
    if (wasLive) {
      setConn('reconnecting');
      $('journal-state').textContent = 'reconnecting…';
      run.timer = setTimeout(openRunStream, 500);
      return;
    }
    setConn('offline');
    $('journal-state').textContent = 'offline: retrying';
    refreshRun();
    run.timer = setTimeout(openRunStream, run.retry);
    run.retry = Math.min(run.retry * 2, 30000);
  }

  function openRunStream() {
    clearTimeout(run.timer);
    if (run.stream) run.stream.close();
    run.stream = null;
    if (run.ended) return;
    $('journal-state').textContent = 'connecting…';
    const attempt = ++run.attempt;
    // Goes on after the last line shown (`from_seq`): a reconnect misses and repeats nothing.
    withTicket(`/v1/runs/${encodeURIComponent(run.id)}/events`, { stream: 'run', run_id: run.id }).then((url) => {
      if (attempt === run.attempt && !run.ended) connectRun(`${url}&from_seq=${run.lastSeq + 1}`, attempt);
    }, () => {
      if (attempt === run.attempt) runRetry(false);
    });
  }

  function connectRun(url, attempt) {
    const es = new EventSource(url);
    run.stream = es;
    let live = false;
    es.addEventListener('open', () => {
      live = true;
      setConn('live');
      run.retry = 1000;
      $('journal-state').textContent = 'live';
    });
    es.addEventListener('journal', (m) => appendJournal(parseJson(m.data)));
    es.addEventListener('status', (m) => {
      const s = parseJson(m.data) || {};
      run.ended = true;
      es.close();
      setRunStatus(s.status);
      setConn('ended');
      $('journal-state').textContent = 'run ended';
      refreshRun();
    });
    es.addEventListener('error', () => {
      // Never EventSource's own reconnect: it would present the spent ticket again.
      es.close();
      if (attempt !== run.attempt) return;
      run.stream = null;
      runRetry(live);
    });
  }

  function startRun(id) {
    $('run-view').hidden = false;
    $('run-id').textContent = id;
    run.id = id;
    document.title = `Run ${shortId(id)} · Delta`;
    if (!UUID.test(id)) {
      const b = $('run-error');
      b.textContent = `“${id}” is not a run id.`;
      b.hidden = false;
      return;
    }
    refreshRun();
    openRunStream();
  }

  // ---------------------------------------------------------------------------------------
  // One question through an answer link: `/answer#link=…`

  function linkError(text) {
    const b = $('link-error');
    b.textContent = text;
    b.hidden = false;
  }

  async function startLink() {
    $('link-view').hidden = false;
    $('settings-toggle').hidden = true;
    document.title = 'A question for you · Delta';
    if (!answerLink) {
      linkError('This page answers a question through a link, and no link came with it: open the link you were given again.');
      return;
    }
    let v;
    try {
      v = await api('POST', '/v1/answer-links/open', { link: answerLink });
    } catch (err) {
      linkError(err.status === 404 ? 'This link is unknown, used or expired: ask for the question again where you got it.' : `Cannot open the link: ${err.message}`);
      return;
    }
    const until = parseTime(v.expires_at);
    $('link-who').textContent = `You answer as ${v.responder}. The link works for one answer${Number.isNaN(until) ? '' : `, until ${when(until)}`}.`;
    const q = { ...v.interaction.request, run_id: v.run_id, request_hash: v.interaction.request_hash };
    if (v.interaction.state !== 'PENDING') {
      linkError(v.interaction.state === 'ANSWERED' ? 'This question is answered already.' : `This question is closed (${String(v.interaction.state).toLowerCase()}).`);
      return;
    }
    const card = makeCard(q, 'link', (c, why) => {
      if (why === 'sent') {
        try { sessionStorage.removeItem(LINK_KEY); } catch (_) { /* gone with the tab */ }
      }
    });
    // Claims are for people with a token in the inbox; a link answers, once.
    const claim = card.node.querySelector('.claim-actions');
    if (claim) claim.remove();
    card.setHuman({ claim: v.interaction.claim, tally: v.interaction.tally });
    $('link-card').replaceChildren(card.node);
    tick();
  }

  // ---------------------------------------------------------------------------------------
  // Start

  function route() {
    if (location.pathname === '/answer') return { view: 'link' };
    const m = /^\/runs\/([^/]+)\/?$/.exec(location.pathname);
    if (m) {
      // A malformed escape (`/runs/%E0`) is not a run id: said so, not a blank page.
      let id = m[1];
      try { id = decodeURIComponent(m[1]); } catch (_) { /* shown as it is, and refused */ }
      return { view: 'run', id };
    }
    return { view: 'inbox' };
  }

  /** Starts (or, after a token change, restarts) the view from scratch. */
  function restart(fromSettings) {
    if (!fromSettings) lastTokenAsk = '';
    const r = route();
    if (r.view === 'link') return;
    if (r.view === 'run') {
      run.ended = false;
      clearTimeout(run.timer);
      if (run.stream) run.stream.close();
      refreshRun();
      openRunStream();
    } else {
      clearTimeout(inbox.timer);
      inbox.retry = 1000;
      loadPending().catch(showInboxError);
      openInboxStream();
      loadGrants();
    }
  }

  function start() {
    const r = route();
    if (r.view === 'link') startLink();
    else if (r.view === 'run') startRun(r.id);
    else startInbox();
    if (offeredToken && r.view !== 'link') openSettings(offerText());
    setInterval(tick, 1000);
    tick();
  }

  start();
})();
