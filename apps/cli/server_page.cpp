// The page at /: a prompt form that queues a job (POST /v1/jobs), follows its progress stream
// (fetch, so an API key can go in a header), shows previews, the result and this page's history.
#include "server_page.h"

#include <httplib.h>

namespace tessera::cli {
namespace {

constexpr const char* kPage = R"HTML(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>tessera</title>
<style>
body { font-family: sans-serif; max-width: 52em; margin: 1em auto; }
label { display: inline-block; margin: 0.2em 0.6em 0.2em 0; }
input[type=number] { width: 6em; }
#prompt { width: 100%; }
progress { width: 100%; }
img { image-rendering: pixelated; width: 256px; height: auto; border: 1px solid #ccc; }
#history img { width: 96px; margin: 2px; }
</style></head><body>
<h1>tessera</h1>
<form id="form">
<p><input id="prompt" placeholder="prompt" value=""></p>
<label>width <input id="width" type="number" step="16" min="16" placeholder="default"></label>
<label>height <input id="height" type="number" step="16" min="16" placeholder="default"></label>
<label>steps <input id="steps" type="number" min="1" max="200" placeholder="default"></label>
<label>seed <input id="seed" type="number" placeholder="random"></label>
<label>API key <input id="key" type="password" placeholder="none"></label>
<button id="generate" type="submit">Generate</button>
<button id="cancel" type="button" disabled>Cancel</button>
</form>
<p id="status">idle</p>
<progress id="bar" max="1" value="0"></progress>
<p><img id="preview" alt="preview" hidden> <img id="result" alt="result" hidden></p>
<h2>History</h2><div id="history"></div>
<script>
const $ = id => document.getElementById(id);
let job = null;
function headers() {
  const h = {'Content-Type': 'application/json'};
  if ($('key').value) h['Authorization'] = 'Bearer ' + $('key').value;
  return h;
}
async function fail(r) {
  let m = r.status + '';
  try { m += ': ' + (await r.json()).error.message; } catch (e) {}
  $('status').textContent = 'error ' + m;
}
function show(e) {
  $('bar').max = e.steps; $('bar').value = e.step;
  const eta = e.eta_seconds == null ? '' : ', ETA ' + e.eta_seconds.toFixed(1) + ' s';
  $('status').textContent = e.state + ' ' + e.step + '/' + e.steps + eta;
  if (e.preview) { $('preview').src = e.preview; $('preview').hidden = false; }
}
$('form').onsubmit = async ev => {
  ev.preventDefault();
  const body = {prompt: $('prompt').value};
  if ($('width').value || $('height').value)
    body.size = ($('width').value || $('height').value) + 'x' + ($('height').value || $('width').value);
  if ($('steps').value) body.steps = Number($('steps').value);
  if ($('seed').value) body.seed = Number($('seed').value);
  $('generate').disabled = true;
  try {
    let r = await fetch('/v1/jobs', {method: 'POST', headers: headers(), body: JSON.stringify(body)});
    if (r.status != 202) return await fail(r);
    job = (await r.json()).id;
    $('cancel').disabled = false;
    r = await fetch('/v1/jobs/' + job + '/events', {headers: headers()});
    if (!r.ok) return await fail(r);
    const reader = r.body.getReader(), dec = new TextDecoder();
    let buf = '';
    for (;;) {
      const {done, value} = await reader.read();
      if (done) break;
      buf += dec.decode(value, {stream: true});
      let i;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        const line = buf.slice(0, i); buf = buf.slice(i + 2);
        if (line.startsWith('data: ')) show(JSON.parse(line.slice(6)));
      }
    }
    r = await fetch('/v1/jobs/' + job, {headers: headers()});
    const j = await r.json();
    show(j);
    if (j.state == 'done') {
      const src = 'data:image/png;base64,' + j.data[0].b64_json;
      $('result').src = src; $('result').hidden = false; $('preview').hidden = true;
      $('result').dataset.seed = j.seed;
      $('status').textContent = 'done, seed ' + j.seed;
      const h = document.createElement('img');
      h.src = src; h.title = body.prompt + ' (seed ' + j.seed + ')';
      $('history').prepend(h);
    }
  } catch (e) {
    $('status').textContent = 'error ' + e;
  } finally {
    $('generate').disabled = false; $('cancel').disabled = true; job = null;
  }
};
$('cancel').onclick = () => {
  if (job) fetch('/v1/jobs/' + job + '/interrupt', {method: 'POST', headers: headers(), body: ''});
};
</script></body></html>
)HTML";

}  // namespace

void register_web_page(httplib::Server& http) {
  http.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(kPage, "text/html; charset=utf-8");
  });
}

}  // namespace tessera::cli
