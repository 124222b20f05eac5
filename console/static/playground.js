// hearth console playground: a chat completion streamed from the
// deployment API, straight from the browser (the deployment must allow
// the console's origin), with a stop button and the request as curl.
"use strict";

(function () {
  var form = document.getElementById("chat");
  if (!form) return;
  var base = form.getAttribute("data-url");
  var model = form.getAttribute("data-model");
  var out = document.getElementById("pg-output");
  var status = document.getElementById("pg-status");
  var send = document.getElementById("pg-send");
  var stop = document.getElementById("pg-stop");
  var curl = document.getElementById("pg-curl");
  var controller = null;

  function body() {
    var b = {
      model: model,
      stream: true,
      messages: [{ role: "user", content: form.elements.message.value }],
    };
    var t = parseFloat(form.elements.temperature.value);
    if (!isNaN(t)) b.temperature = t;
    var m = parseInt(form.elements.max_tokens.value, 10);
    if (!isNaN(m)) b.max_tokens = m;
    return b;
  }

  function shellQuote(s) { return "'" + s.replace(/'/g, "'\\''") + "'"; }

  function showCurl() {
    curl.textContent = "curl -sN " + base + "/chat/completions \\\n" +
      "  -H \"Authorization: Bearer $HEARTH_API_KEY\" -H \"Content-Type: application/json\" \\\n" +
      "  -d " + shellQuote(JSON.stringify(body()));
  }
  form.addEventListener("input", showCurl);
  showCurl();

  function finish(msg) {
    controller = null;
    send.disabled = false;
    stop.disabled = true;
    out.setAttribute("aria-busy", "false");
    status.textContent = msg;
  }

  stop.addEventListener("click", function () {
    if (controller) controller.abort();
  });

  form.addEventListener("submit", function (ev) {
    ev.preventDefault();
    if (controller) return;
    showCurl();
    out.textContent = "";
    status.textContent = "Waiting for the model…";
    send.disabled = true;
    stop.disabled = false;
    out.setAttribute("aria-busy", "true");
    controller = new AbortController();
    var tokens = 0;
    fetch(base + "/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json", Authorization: "Bearer " + form.elements.key.value.trim() },
      body: JSON.stringify(body()),
      signal: controller.signal,
    }).then(function (resp) {
      if (!resp.ok) {
        return resp.json().then(function (e) {
          throw new Error((e && e.error && e.error.message) || ("HTTP " + resp.status));
        }, function () { throw new Error("HTTP " + resp.status); });
      }
      status.textContent = "Streaming…";
      var reader = resp.body.getReader();
      var dec = new TextDecoder();
      var buf = "";
      function pump() {
        return reader.read().then(function (r) {
          if (r.done) return;
          buf += dec.decode(r.value, { stream: true });
          var i;
          while ((i = buf.indexOf("\n")) >= 0) {
            var line = buf.slice(0, i).trim();
            buf = buf.slice(i + 1);
            if (line.indexOf("data:") !== 0) continue;
            var data = line.slice(5).trim();
            if (data === "[DONE]") return;
            var chunk = JSON.parse(data);
            if (chunk.error) throw new Error(chunk.error.message);
            var c = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
            if (c && c.content) {
              out.textContent += c.content;
              tokens++;
              out.setAttribute("data-tokens", String(tokens));
            }
          }
          return pump();
        });
      }
      return pump();
    }).then(function () {
      finish("Done: " + tokens + " chunks.");
    }, function (err) {
      if (err.name === "AbortError") {
        finish("Stopped after " + tokens + " chunks.");
      } else if (err instanceof TypeError) {
        finish("The deployment API could not be reached from this page (" + err.message + "): it must be running and allow this console's origin (cors-allowed-origins).");
      } else {
        finish("Error: " + err.message);
      }
    });
  });
})();
