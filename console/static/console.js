// hearth console: copy buttons and the live status of servers. No inline
// script anywhere (the Content-Security-Policy forbids it); pages work
// without this file, which only adds to them.
"use strict";

document.addEventListener("click", function (ev) {
  var btn = ev.target.closest("button[data-copy]");
  if (!btn) return;
  var src = document.getElementById(btn.getAttribute("data-copy"));
  if (!src) return;
  var text = src.textContent;
  var done = function () {
    var was = btn.textContent;
    btn.textContent = "Copied";
    setTimeout(function () { btn.textContent = was; }, 1500);
  };
  if (navigator.clipboard && navigator.clipboard.writeText) {
    navigator.clipboard.writeText(text).then(done, function () { selectText(src); });
  } else {
    selectText(src);
  }
});

function selectText(el) {
  var r = document.createRange();
  r.selectNodeContents(el);
  var s = window.getSelection();
  s.removeAllRanges();
  s.addRange(r);
}

// Live status: every status badge on the page is refreshed from
// /console/servers/status every two seconds while some server is not
// settled. The page is never reloaded under the user, who may be typing.
(function () {
  var badges = document.querySelectorAll("[data-status-for]");
  if (!badges.length) return;
  var watch = document.querySelector("[data-watch]");
  var url = "/console/servers/status" + (watch ? "?id=" + encodeURIComponent(watch.getAttribute("data-watch")) : "");
  var settled = { running: true, failed: true, deleted: true };
  function unsettled() {
    for (var i = 0; i < badges.length; i++) {
      if (!settled[badges[i].getAttribute("data-status")]) return true;
    }
    return false;
  }
  function tick() {
    if (!unsettled()) return;
    fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } }).then(function (resp) {
      if (resp.status === 401) {
        location.href = "/console/sign-in?expired=1&next=" + encodeURIComponent(location.pathname);
        return null;
      }
      if (resp.status === 404) return []; // the watched server is gone
      return resp.ok ? resp.json() : null;
    }).then(function (list) {
      if (!list) return;
      var seen = {};
      list.forEach(function (s) {
        seen[s.id] = true;
        var b = document.querySelector('[data-status-for="' + s.id + '"]');
        var d = document.querySelector('[data-detail-for="' + s.id + '"]');
        if (b) { b.textContent = s.status; b.setAttribute("data-status", s.status); }
        if (d) d.textContent = s.detail;
      });
      badges.forEach(function (b) {
        var id = b.getAttribute("data-status-for");
        if (!seen[id]) {
          b.textContent = "deleted";
          b.setAttribute("data-status", "deleted");
          var d = document.querySelector('[data-detail-for="' + id + '"]');
          if (d) d.textContent = "";
        }
      });
    }).catch(function () {}).then(function () { setTimeout(tick, 2000); });
  }
  setTimeout(tick, 2000);
})();
