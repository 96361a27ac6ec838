#!/usr/bin/env python3
"""The page at / of tessera serve in headless Chromium: type a prompt and a seed, press Generate,
wait for the image, and check it is tessera generate's image for that prompt and seed.
Chromium is driven over the DevTools protocol on a pipe (--remote-debugging-pipe: fds 3 and 4,
NUL-separated JSON), so no WebSocket or browser-automation package is needed.
Usage: serve_page_test.py TESSERA_CLI. Exit 0 on success; 77 (skip) without chromium."""
import base64, json, os, shutil, subprocess, sys, tempfile, time

cli = sys.argv[1]
browser = shutil.which("chromium") or shutil.which("chromium-browser")
if not browser:
    print("chromium not installed: skipped")
    sys.exit(77)

server = subprocess.Popen([cli, "serve", "--port", "0"], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True)
tmp = tempfile.mkdtemp(prefix="tessera_page_")
chrome = None
try:
    line = server.stdout.readline()
    assert "http://127.0.0.1:" in line, f"server did not start: {line!r}"
    url = line.strip().split(" on ")[-1] + "/"

    to_chrome_r, to_chrome_w = os.pipe()
    from_chrome_r, from_chrome_w = os.pipe()
    # Chromium reads commands on fd 3 and writes answers on fd 4.
    def child_fds():
        os.dup2(to_chrome_r, 3)
        os.dup2(from_chrome_w, 4)
    chrome = subprocess.Popen(
        [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--remote-debugging-pipe", f"--user-data-dir={tmp}/profile", "about:blank"],
        preexec_fn=child_fds, close_fds=False,  # fds 3 and 4 are set up by child_fds
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(to_chrome_r)
    os.close(from_chrome_w)
    out = os.fdopen(to_chrome_w, "wb", buffering=0)
    inp = os.fdopen(from_chrome_r, "rb", buffering=0)
    pending = b""
    next_id = [0]

    def call(method, session=None, **params):
        next_id[0] += 1
        msg = {"id": next_id[0], "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        out.write(json.dumps(msg).encode() + b"\0")
        global pending
        while True:
            while b"\0" not in pending:
                chunk = inp.read(65536)
                assert chunk, "chromium closed the pipe"
                pending += chunk
            raw, pending = pending.split(b"\0", 1)
            m = json.loads(raw)
            if m.get("id") == next_id[0]:
                assert "error" not in m, m
                return m["result"]

    target = call("Target.createTarget", url=url)["targetId"]
    session = call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]

    def js(expr):
        r = call("Runtime.evaluate", session, expression=expr, returnByValue=True,
                 awaitPromise=True)
        return r["result"].get("value")

    deadline = time.time() + 60
    while js("document.readyState") != "complete" or not js("!!document.getElementById('prompt')"):
        assert time.time() < deadline, "the page did not load"
        time.sleep(0.1)
    # Type the prompt and the seed as a user would: focus, then key events through Input.
    for field, text in (("prompt", "a yellow star"), ("seed", "5"), ("steps", "4")):
        js(f"document.getElementById('{field}').focus()")
        call("Input.insertText", session, text=text)
    js("document.getElementById('generate').click()")
    while not js("document.getElementById('result').dataset.seed || ''"):
        assert time.time() < deadline, "no image: status " + str(js(
            "document.getElementById('status').textContent"))
        time.sleep(0.1)
    seed = js("document.getElementById('result').dataset.seed")
    src = js("document.getElementById('result').src")
    history = js("document.querySelectorAll('#history img').length")
    status = js("document.getElementById('status').textContent")
    assert seed == "5", seed
    assert history == 1, history
    assert status.startswith("done"), status
    png = base64.b64decode(src.split(",", 1)[1])
    ref = os.path.join(tmp, "cli.png")
    subprocess.run([cli, "generate", "--prompt", "a yellow star", "--seed", "5", "--steps", "4",
                    "-o", ref], check=True, stderr=subprocess.DEVNULL)
    assert png == open(ref, "rb").read(), "the page's image differs from tessera generate's"
    print("page test: typed a prompt, got the CLI's image (seed 5, %d bytes)" % len(png))
finally:
    if chrome:
        chrome.kill()
        chrome.wait()
    server.kill()
    server.wait()
    shutil.rmtree(tmp, ignore_errors=True)
