// The console's only script: times in the browser's zone, and the
// dashboard's counts refreshed from GET /api/v1/status. Every page works
// without it.
"use strict";

function localTimes(root) {
  root.querySelectorAll("time[datetime]").forEach(function (t) {
    var d = new Date(t.getAttribute("datetime"));
    if (!isNaN(d)) {
      t.textContent = d.toLocaleString();
    }
  });
}

function age(s) {
  if (s === null || s === undefined) return "–";
  s = Math.round(s);
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m " + (s % 60) + "s";
  if (s < 172800) return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m";
  return Math.floor(s / 86400) + "d " + Math.floor((s % 86400) / 3600) + "h";
}

// row finds the table's row for key (by attr), adding one with cells
// named by keys when the channel or destination is new.
function row(tbody, attr, key, keys, link) {
  var rows = tbody.querySelectorAll("tr[" + attr + "]");
  for (var i = 0; i < rows.length; i++) {
    if (rows[i].getAttribute(attr) === key) return rows[i];
  }
  var empty = tbody.querySelector("tr.empty");
  if (empty) empty.remove();
  var tr = document.createElement("tr");
  tr.setAttribute(attr, key);
  var th = document.createElement("th");
  th.scope = "row";
  var a = document.createElement("a");
  a.href = link + encodeURIComponent(key);
  a.textContent = key;
  th.appendChild(a);
  tr.appendChild(th);
  keys.forEach(function (k) {
    var td = document.createElement("td");
    td.className = "n";
    td.setAttribute("data-k", k);
    tr.appendChild(td);
  });
  tbody.appendChild(tr);
  return tr;
}

function set(tr, k, v) {
  var td = tr.querySelector('[data-k="' + k + '"]');
  if (td && td.textContent !== String(v)) td.textContent = String(v);
}

function apply(st) {
  var ch = document.querySelector("#channels tbody");
  (st.channels || []).forEach(function (c) {
    var tr = row(ch, "data-channel", c.channel, ["received", "queued", "processed", "error", "oldest"], "/messages?channel=");
    var by = c.by_status || {};
    set(tr, "received", c.received);
    set(tr, "queued", c.queued);
    set(tr, "processed", by.processed || 0);
    set(tr, "error", by.error || 0);
    set(tr, "oldest", age(c.oldest_queued_seconds));
  });
  var dt = document.querySelector("#destinations tbody");
  if (dt) {
    (st.destinations || []).forEach(function (d) {
      var tr = row(dt, "data-destination", d.destination, ["queued", "in_flight", "delivered", "dead", "oldest"], "/messages?destination=");
      set(tr, "queued", d.queued);
      set(tr, "in_flight", d.in_flight);
      set(tr, "delivered", d.delivered);
      set(tr, "dead", d.dead);
      set(tr, "oldest", age(d.oldest_queued_seconds));
      tr.classList.toggle("attention", d.dead > 0);
    });
  }
  if (st.cluster) {
    document.querySelectorAll("[data-cluster]").forEach(function (el) {
      var v = st.cluster[el.getAttribute("data-cluster")];
      el.textContent = v === "" || v === undefined || v === null ? "none" : String(v);
    });
  }
  var at = document.querySelector("[data-status-at]");
  if (at && st.at) {
    at.setAttribute("datetime", st.at);
    at.title = st.at;
    localTimes(at.parentNode);
  }
}

function refresh(url) {
  fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
    .then(function (r) {
      if (r.status === 401) {
        window.location.assign("/login");
        return null;
      }
      return r.ok ? r.json() : null;
    })
    .then(function (st) {
      if (st) apply(st);
    })
    .catch(function () {});
}

document.addEventListener("DOMContentLoaded", function () {
  localTimes(document);
  var t = document.querySelector("table[data-refresh]");
  if (t) {
    var live = document.querySelector("[data-live]");
    if (live) live.hidden = false;
    var url = t.getAttribute("data-refresh");
    window.setInterval(function () { refresh(url); }, 5000);
  }
});
