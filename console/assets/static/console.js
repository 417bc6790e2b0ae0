// kumi console: polls the console's JSON every second and redraws the page.
// Every value goes into the page as text (textContent), never as markup.
'use strict';
(function () {
  const body = document.body;
  const root = body.dataset.root;
  const sub = body.dataset.sub;
  const csrf = body.dataset.csrf;
  const actionsOn = body.dataset.actions === 'true';
  const seg = encodeURIComponent;

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = String(text);
    return e;
  }

  function row(cells) {
    const tr = el('tr');
    for (const c of cells) {
      const td = el('td');
      if (c instanceof Node) td.append(c); else td.textContent = String(c);
      tr.append(td);
    }
    return tr;
  }

  function link(href, text) {
    const a = el('a', '', text);
    a.href = href;
    return a;
  }

  async function call(path, init) {
    const resp = await fetch(root + path, Object.assign({ credentials: 'same-origin' }, init));
    const body = await resp.json().catch(() => ({ error: 'HTTP ' + resp.status }));
    if (!resp.ok) throw new Error(body.error || 'HTTP ' + resp.status);
    return body;
  }

  function post(path) {
    return call(path, { method: 'POST', headers: { 'X-Kumi-Csrf': csrf } });
  }

  // Workers' colours: each worker on the page gets its own colour from a
  // palette whose every two colours differ clearly (CIE76 ΔE above 25), so
  // that any handful of workers, however alike their names (w1, w2, …), look
  // apart. A worker's preferred colour comes from a hash of its name, the
  // next free one when another worker has it; a worker keeps its colour for
  // as long as the page sees it, and the same set of workers gets the same
  // colours on every page. Past the palette, hues from the hash.
  const palette = ['#6aa3f0', '#f0857a', '#78cc88', '#f6c445', '#be8fea', '#4fd0d4', '#f7a3d6', '#b9bf4f', '#c89a74'];
  const colours = new Map(); // worker -> its colour's index (palette.length and above: a hue)

  function hash(worker) {
    let h = 0;
    for (const ch of worker) h = (h * 31 + ch.codePointAt(0)) >>> 0;
    return h;
  }

  // paint gives a colour to each worker of names (sorted, so that the same
  // set gets the same colours) and frees the colours of workers not in it.
  function paint(names) {
    const seen = new Set(names.filter(Boolean));
    for (const w of [...colours.keys()]) if (!seen.has(w)) colours.delete(w);
    const taken = new Set(colours.values());
    for (const w of [...seen].sort()) {
      if (colours.has(w)) continue;
      let i = hash(w) % palette.length;
      for (let n = 0; n < palette.length && taken.has(i); n++) i = (i + 1) % palette.length;
      if (taken.has(i)) i = palette.length + (hash(w) % 360);
      colours.set(w, i);
      taken.add(i);
    }
  }

  function colour(worker) {
    if (!colours.has(worker)) paint([...colours.keys(), worker]);
    const i = colours.get(worker);
    return i < palette.length ? palette[i] : 'hsl(' + (i - palette.length) + ', 55%, 75%)';
  }

  function secs(s) {
    const a = Math.abs(s);
    if (a < 10) return a.toFixed(1) + ' s';
    if (a < 3600) return Math.round(a) + ' s';
    return (a / 3600).toFixed(1) + ' h';
  }

  function plural(n, what) { return n + ' ' + what + (n === 1 ? '' : 's'); }

  function ago(s) { return secs(s) + ' ago'; }
  function until(s) { return s >= 0 ? 'in ' + secs(s) : 'expired ' + ago(-s); }

  const dot = document.getElementById('live');
  function live(ok) { dot.className = 'live ' + (ok ? 'on' : 'off'); }

  // poll calls fetchAndDraw now and a second after each call ends.
  function poll(fetchAndDraw) {
    const tick = () => fetchAndDraw()
      .then(() => { live(true); showError(''); }, (e) => { live(false); showError(e.message); })
      .finally(() => setTimeout(tick, 1000));
    tick();
  }

  function showError(msg) {
    const e = document.getElementById('error');
    if (!e) return;
    e.textContent = msg;
    e.hidden = !msg;
  }

  // The overview: one row per subscription.
  function overview() {
    const tbody = document.getElementById('overview');
    poll(async () => {
      const subs = await call('api/overview');
      if (!subs.length) {
        const td = el('td', '', 'no subscriptions yet: no worker has started one in this schema');
        td.colSpan = 6;
        const tr = el('tr');
        tr.append(td);
        tbody.replaceChildren(tr);
        return;
      }
      tbody.replaceChildren(...subs.map((s) => row([
        link(root + 's/' + seg(s.subscription), s.subscription), s.buckets, s.held, s.live_workers,
        s.checkpoints,
        s.pending_dead_letters ? link(root + 's/' + seg(s.subscription) + '/letters', s.pending_dead_letters) : '0',
      ])));
    });
  }

  // The subscription: the bucket map, its workers, the timeline.
  function subscription() {
    let selected = null;
    let state = null;
    let outcome = null; // the last action's outcome: [bucket, class, text]
    let actions = null; // the selected bucket's action controls
    const map = document.getElementById('map');
    map.addEventListener('click', (ev) => {
      const cell = ev.target.closest('.cell');
      if (!cell) return;
      selected = Number(cell.dataset.bucket);
      outcome = null;
      draw();
    });

    function draw() {
      const s = state;
      paint([...s.workers.map((m) => m.worker), ...s.buckets.map((b) => b.owner),
        ...(s.resize ? [...s.resize.old, ...s.resize.new].map((b) => b.owner) : [])]);
      const held = s.buckets.filter((b) => b.live).length;
      document.getElementById('stats').textContent = 'generation ' + s.generation + ', ' +
        plural(s.bucket_count, 'bucket') + ', ' + held + ' held, ' +
        plural(s.live_workers, 'live worker') + ', head position ' + s.head + (s.category ? ', category ' + s.category : '') +
        ' · database time ' + new Date(s.now).toISOString();

      const maxLag = Math.max(1, ...s.buckets.map((b) => b.lag || 0));
      map.replaceChildren(...s.buckets.map((b) => {
        const c = el('div', 'cell');
        c.dataset.bucket = b.bucket;
        c.dataset.owner = b.owner;
        if (!b.owner) c.classList.add('free');
        else c.style.backgroundColor = colour(b.owner);
        if (b.owner && !b.live) c.classList.add('expired');
        if (b.bucket === selected) c.classList.add('selected');
        c.append(el('div', 'b', '#' + b.bucket + (b.claim_worker ? ' → ' + b.claim_worker : '')));
        c.append(el('div', 'o', b.owner || 'free'));
        if (b.lag !== null) {
          c.append(el('div', '', 'lag ' + b.lag));
          const bar = el('div', 'lag');
          bar.style.width = (100 * b.lag / maxLag) + '%';
          c.append(bar);
        }
        c.title = 'bucket ' + b.bucket + ': ' + (b.owner || 'free') + ', epoch ' + b.epoch;
        return c;
      }));
      if (!s.buckets.length) map.replaceChildren(el('p', 'note', 'no buckets: no worker has started this subscription'));
      detail();
      drawResize(s.resize);
      drawCharts(s.series || []);
      const fo = document.getElementById('failovers');
      fo.hidden = !(s.failovers && s.failovers.length);
      fo.replaceChildren(...(s.failovers || []).map((f) => el('p', '', new Date(f.at).toISOString() +
        ': the server changed (' + f.reason + ': ' + f.old + ' → ' + f.new + '), found by ' + f.found_by +
        '; positions ' + (f.head_after + 1) + ' to ' + f.head_before +
        ' were handed out again: handlers may have seen events that no longer exist (kumi status --failovers)')));

      document.getElementById('workers').replaceChildren(...s.workers.map((m) => {
        const sw = el('span', 'swatch');
        sw.style.backgroundColor = colour(m.worker);
        return row([sw, m.worker, m.kind, m.session_gone ? 'no (session gone)' : m.live ? 'yes' : 'no',
          ago(m.heartbeat_age_seconds), until(m.expires_in_seconds), m.owns]);
      }));

      drawParked(s);

      const letters = document.getElementById('letters');
      letters.textContent = 'pending dead letters: ' + s.pending_dead_letters + (s.pending_dead_letters_more ? '+' : '');

      document.getElementById('since').textContent = new Date(s.watching_since).toISOString();
      const tl = document.getElementById('timeline');
      tl.replaceChildren(...s.timeline.map((c) => {
        const li = el('li');
        li.append(el('span', 'at', new Date(c.at).toISOString().slice(11, 23) + ' '));
        li.append(el('span', 'k ' + c.kind, c.kind));
        let what = '';
        if (c.bucket >= 0) what = 'bucket ' + c.bucket + (c.generation !== s.generation ? ' of generation ' + c.generation : '') + ' ';
        if (c.from && c.to) what += c.from + ' → ' + c.to;
        else what += c.from || c.to || '';
        if (c.epoch) what += ' (epoch ' + c.epoch + ')';
        li.append(el('span', 'what', what + ' '));
        if (c.evidence) li.append(el('span', 'ev', c.evidence));
        if (c.by) li.append(el('span', 'by', ' by ' + c.by));
        return li;
      }));
      if (!s.timeline.length) tl.replaceChildren(el('li', 'note', 'no changes recorded yet'));
    }

    // A resize in progress: its state and both generations' buckets.
    // The charts: lag (all buckets) and the store's append rate over the
    // last hour, from the points the console's looks took.
    function drawCharts(points) {
      const charts = document.getElementById('charts');
      const lagged = points.filter((p) => p.lag >= 0);
      const rates = [];
      for (let i = 1; i < points.length; i++) {
        const dt = (new Date(points[i].at) - new Date(points[i - 1].at)) / 1000;
        if (dt > 0) rates.push({ at: points[i].at, v: Math.max(0, points[i].head - points[i - 1].head) / dt });
      }
      charts.replaceChildren(
        chart('lag, events behind (all buckets)', lagged.map((p) => ({ at: p.at, v: p.lag })),
          'lag is not measured: the category is unknown'),
        chart('appended to the store, events/s', rates, 'two looks are needed'));
    }

    function chart(title, data, empty) {
      const fig = el('figure', 'chart');
      const last = data.length ? data[data.length - 1].v : null;
      fig.append(el('figcaption', '', title + (last === null ? '' : ': ' + fmt(last))));
      if (data.length < 2) {
        fig.append(el('p', 'note', data.length ? 'the chart fills as the console looks (a point per 10 s)' : empty));
        return fig;
      }
      const w = 300, h = 60, ns = 'http://www.w3.org/2000/svg';
      const t0 = new Date(data[0].at).getTime(), t1 = new Date(data[data.length - 1].at).getTime();
      const top = Math.max(1, ...data.map((d) => d.v));
      const svg = document.createElementNS(ns, 'svg');
      svg.setAttribute('viewBox', '0 0 ' + w + ' ' + h);
      svg.setAttribute('width', w);
      svg.setAttribute('height', h);
      const line = document.createElementNS(ns, 'polyline');
      line.setAttribute('points', data.map((d) => {
        const x = t1 > t0 ? (new Date(d.at).getTime() - t0) / (t1 - t0) * w : 0;
        return x.toFixed(1) + ',' + (h - 2 - d.v / top * (h - 4)).toFixed(1);
      }).join(' '));
      svg.append(line);
      fig.append(svg);
      fig.append(el('div', 'axis', 'max ' + fmt(top) + ' · ' + Math.round((t1 - t0) / 60000) + ' min'));
      return fig;
    }

    function fmt(v) { return v >= 100 || Number.isInteger(v) ? String(Math.round(v)) : v.toFixed(1); }

    function drawResize(r) {
      const section = document.getElementById('resize');
      section.hidden = !r;
      if (!r) return;
      document.getElementById('resize-state').textContent = 'generation ' + r.generation + ' → ' +
        r.next_generation + ': ' + r.from + ' → ' + r.to + ' buckets, state ' + r.state +
        (r.cut === null ? ', cut not decided yet' : ', cut at position ' + r.cut) + ' · old drained ' +
        r.drained + '/' + r.from + ', new ready ' + r.ready + '/' + r.to + ' · requested ' +
        ago(r.requested_seconds_ago) + (r.requested_by ? ' by ' + r.requested_by : '');
      document.getElementById('resize-old-title').textContent = 'Old generation ' + r.generation + ' (' + r.from + ' buckets)';
      document.getElementById('resize-new-title').textContent = 'New generation ' + r.next_generation + ' (' + r.to + ' buckets)';
      const cells = (list, old) => list.map((b) => {
        const c = el('div', 'cell');
        c.dataset.slot = b.slot;
        if (!b.owner) c.classList.add('free');
        else c.style.backgroundColor = colour(b.owner);
        let state;
        if (old) {
          state = b.drained ? 'drained' : b.proposal !== null ? 'proposed ' + b.proposal : 'serving';
          if (b.drained) c.classList.add('drained');
        } else {
          state = b.ready ? 'ready' : 'standby';
          if (!b.ready) c.classList.add('standby');
        }
        c.append(el('div', 'b', '#' + b.bucket));
        c.append(el('div', 'o', b.owner || 'free'));
        c.append(el('div', 's', state));
        c.title = 'bucket ' + b.bucket + ' (slot ' + b.slot + '): ' + (b.owner || 'free') + ', epoch ' + b.epoch + ', ' + state;
        return c;
      });
      document.getElementById('resize-old').replaceChildren(...cells(r.old, true));
      document.getElementById('resize-new').replaceChildren(...cells(r.new, false));
    }

    function detail() {
      const box = document.getElementById('detail');
      const b = state.buckets.find((x) => x.bucket === selected);
      if (!b) { box.hidden = true; return; }
      box.hidden = false;
      const dl = el('dl', 'facts');
      const facts = [
        ['bucket', b.bucket], ['owner', b.owner || 'free'], ['lease', b.owner ? (b.live ? 'live' : 'expired') : '-'],
        ['epoch', b.epoch], ['lease expiry', b.expires_in_seconds === null ? '-' : until(b.expires_in_seconds)],
        ['pending claim', b.claim_worker || '-'], ['checkpoint', b.checkpoint +
          (b.checkpoint_age_seconds !== undefined ? ' (written ' + ago(b.checkpoint_age_seconds) + ')' : '')],
        ['lag', b.lag === null ? 'not measured' : b.lag +
          (b.oldest_lag_seconds !== undefined ? ' (oldest ' + ago(b.oldest_lag_seconds) + ')' : '')],
      ];
      for (const [k, v] of facts) dl.append(el('dt', '', k), el('dd', '', v));
      // The actions are built once per selected bucket, not on every poll:
      // what is typed into them survives the redraws.
      if (!actions || actions.dataset.bucket !== String(b.bucket)) actions = actionsOf(b.bucket);
      const old = actions.querySelector('#outcome');
      if (old) old.remove();
      if (outcome && outcome[0] === b.bucket) {
        const o = el('span', 'outcome ' + outcome[1], outcome[2]);
        o.id = 'outcome';
        actions.append(o);
      }
      if (box.firstChild instanceof HTMLDListElement && box.lastChild === actions) box.firstChild.replaceWith(dl);
      else box.replaceChildren(dl, actions);
    }

    // actionsOf builds the action controls of one bucket: relinquish, and
    // reset its checkpoint (with force and beyond-head, as the CLI's flags).
    function actionsOf(bucket) {
      const p = el('div', 'actions');
      p.dataset.bucket = bucket;
      const base = 'api/s/' + seg(sub) + '/buckets/' + bucket + '/';
      const act = (path) => post(path)
        .then((r) => { outcome = [bucket, 'good', r.message]; }, (e) => { outcome = [bucket, 'bad', e.message]; })
        .finally(detail);
      const control = (tag, id, text) => {
        const c = el(tag, '', text);
        c.id = id;
        c.disabled = !actionsOn;
        if (!actionsOn) c.title = 'actions are disabled';
        return c;
      };
      const checkbox = (id, text) => {
        const label = el('label', 'check');
        const c = control('input', id);
        c.type = 'checkbox';
        label.append(c, ' ' + text);
        return [label, c];
      };
      const relinquish = control('button', 'relinquish', 'Relinquish');
      relinquish.addEventListener('click', () => act(base + 'relinquish'));
      const pos = control('input', 'reset-position');
      pos.type = 'number';
      pos.min = '0';
      pos.placeholder = 'position';
      const [forceLabel, force] = checkbox('reset-force', 'force (fence out a live owner)');
      const [beyondLabel, beyond] = checkbox('reset-beyond-head', 'beyond the head');
      const reset = control('button', 'reset', 'Reset checkpoint');
      reset.addEventListener('click', () => {
        const q = new URLSearchParams({ position: pos.value.trim() });
        if (force.checked) q.set('force', '1');
        if (beyond.checked) q.set('beyond_head', '1');
        act(base + 'reset?' + q);
      });
      p.append(relinquish, el('span', 'sep', ' · '), pos, reset, forceLabel, beyondLabel);
      return p;
    }

    // Parked streams: a row each, and one set of controls built once (what
    // is typed survives the redraws); a click on a row picks its stream.
    const parkedBody = document.getElementById('parked');
    const parkedActions = parkedControls();
    parkedBody.addEventListener('click', (ev) => {
      const tr = ev.target.closest('tr');
      if (tr && tr.dataset.stream) parkedActions.querySelector('#parked-stream').value = tr.dataset.stream;
    });

    function drawParked(s) {
      const ps = s.parked_streams || [];
      parkedBody.replaceChildren(...ps.map((p) => {
        const state = p.action === 'skip' ? 'skipped' : p.action ? p.action + ' asked ' + ago(p.requested_seconds_ago) : 'parked';
        const tr = row([p.stream, p.bucket === null ? '-' : p.bucket, p.waiting, ago(p.parked_seconds_ago), state, p.reason]);
        tr.dataset.stream = p.stream;
        return tr;
      }));
      if (!ps.length) parkedBody.replaceChildren(row(['none', '', '', '', '', '']));
      if (s.parked_streams_more) parkedBody.append(row(['more are parked: kumi parked list', '', '', '', '', '']));
    }

    function parkedControls() {
      const p = document.getElementById('parked-actions');
      const control = (tag, id, text) => {
        const c = el(tag, '', text);
        c.id = id;
        c.disabled = !actionsOn;
        if (!actionsOn) c.title = 'actions are disabled';
        return c;
      };
      const stream = control('input', 'parked-stream');
      stream.placeholder = 'stream';
      const confirm = control('input', 'parked-confirm');
      confirm.placeholder = 'its name again, to skip';
      const out = el('span', 'outcome');
      const act = (action) => {
        const q = new URLSearchParams({ stream: stream.value.trim() });
        if (action === 'skip') q.set('confirm', confirm.value.trim());
        post('api/s/' + seg(sub) + '/parked/' + action + '?' + q)
          .then((r) => { out.className = 'outcome good'; out.textContent = r.message; },
            (e) => { out.className = 'outcome bad'; out.textContent = e.message; });
      };
      const buttons = ['replay', 'discard', 'skip'].map((action) => {
        const b = control('button', 'parked-' + action, action[0].toUpperCase() + action.slice(1));
        b.addEventListener('click', () => act(action));
        return b;
      });
      p.append(stream, buttons[0], buttons[1], el('span', 'sep', ' · '), confirm, buttons[2], out);
      return p;
    }

    poll(async () => {
      state = await call('api/s/' + seg(sub));
      draw();
    });
  }

  // One dead letter: replay and discard.
  function letter() {
    const id = document.querySelector('[data-letter]').dataset.letter;
    const out = document.getElementById('outcome');
    for (const action of ['replay', 'discard']) {
      document.getElementById(action).addEventListener('click', () => {
        post('api/s/' + seg(sub) + '/letters/' + seg(id) + '/' + action)
          .then((r) => { out.className = 'outcome good'; out.textContent = r.message; },
            (e) => { out.className = 'outcome bad'; out.textContent = e.message; });
      });
    }
  }

  const pages = { overview, subscription, letter };
  if (pages[body.dataset.page]) pages[body.dataset.page]();
})();
