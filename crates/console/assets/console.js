// The console's only script: uploads with progress (drag and drop or the file picker), the
// cluster page's live charts and its in-place updates.
// A file of at most one part is one PUT /upload?bucket=B&key=K; a larger one is a multipart
// upload: POST /upload/start, one PUT /upload/part per slice of the file (each tried up to
// TRIES times), POST /upload/complete with the parts' ETags (or /upload/abort when a part
// fails for good or the completion is refused). Every request carries the session's CSRF token in a header. The page
// reloads once every upload has ended, so the listing shows the new objects.
"use strict";

const MIB = 1024 * 1024;
// Parts are at least this large (S3 wants 5 MiB but the last), fewer requests for big files.
const PART_BYTES_MIN = 16 * MIB;
// S3's limits: 10,000 parts of at most 5 GiB, objects of at most 5 TiB.
const PARTS_MAX = 10000;
const PART_BYTES_MAX = 5 * 1024 * MIB;
const OBJECT_BYTES_MAX = 5 * 1024 * 1024 * MIB;
// Tries of one part, and of the completion, before the upload gives up (a broken connection,
// a node restarting), with a pause before each try again that doubles from RETRY_PAUSE_MS.
const TRIES = 3;
const RETRY_PAUSE_MS = 1000;

function pause(ms) {
  return new Promise((resolve) => window.setTimeout(resolve, ms));
}

// A refusal (4xx) will not change on a retry; no answer or a 5xx might.
function definite(answer) {
  return answer.status === 200 || (answer.status >= 400 && answer.status < 500);
}

// `attempt()` until a definite answer or TRIES tries.
async function tried(attempt) {
  let answer = null;
  for (let n = 0; n < TRIES; n++) {
    if (n > 0) {
      await pause(RETRY_PAUSE_MS * 2 ** (n - 1));
    }
    answer = await attempt();
    if (definite(answer)) {
      break;
    }
  }
  return answer;
}

// How a file of `size` bytes is sent: {parts: 1} for one PUT, else the part size and count;
// {error} when no upload can hold it.
function partPlan(size) {
  if (size > OBJECT_BYTES_MAX) {
    return { error: "the file has " + size + " bytes; an object may have at most 5 TiB (" + OBJECT_BYTES_MAX + " bytes)" };
  }
  if (size <= PART_BYTES_MIN) {
    return { parts: 1, partBytes: size };
  }
  const partBytes = Math.max(PART_BYTES_MIN, Math.ceil(size / PARTS_MAX / MIB) * MIB);
  console.assert(partBytes <= PART_BYTES_MAX);
  return { parts: Math.ceil(size / partBytes), partBytes: partBytes };
}

// One request; resolves to {status, text}. `onProgress(loaded)` follows the body sent.
function send(method, url, csrf, body, contentType, onProgress) {
  return new Promise((resolve) => {
    const xhr = new XMLHttpRequest();
    xhr.open(method, url);
    xhr.setRequestHeader("x-csrf-token", csrf);
    if (contentType) {
      xhr.setRequestHeader("content-type", contentType);
    }
    if (onProgress) {
      xhr.upload.onprogress = (event) => onProgress(event.loaded);
    }
    xhr.onload = () => resolve({ status: xhr.status, text: xhr.responseText });
    xhr.onerror = () => resolve({ status: 0, text: "the connection broke" });
    xhr.send(body);
  });
}

function target(section, key, extra) {
  return new URLSearchParams(Object.assign({ bucket: section.dataset.bucket, key: key }, extra)).toString();
}

// A multipart upload of `file`; resolves to {status, text} like send().
async function uploadParts(section, file, key, plan, progress) {
  const csrf = section.dataset.csrf;
  const started = await send("POST", "/upload/start?" + target(section, key, {}), csrf, null, file.type);
  if (started.status !== 200) {
    return started;
  }
  const upload = started.text;
  const lines = [];
  let done = 0;
  for (let part = 1; part <= plan.parts; part++) {
    const slice = file.slice((part - 1) * plan.partBytes, Math.min(file.size, part * plan.partBytes));
    const url = "/upload/part?" + target(section, key, { upload: upload, part: String(part) });
    const answer = await tried(() => send("PUT", url, csrf, slice, null, (loaded) => progress(done + loaded)));
    if (answer.status !== 200) {
      await send("POST", "/upload/abort?" + target(section, key, { upload: upload }), csrf, null, null);
      return { status: answer.status, text: "part " + part + " of " + plan.parts + ": " + answer.text };
    }
    lines.push(part + " " + answer.text);
    done += slice.size;
    progress(done);
  }
  // Completing again is safe (a completed upload's Complete succeeds). Abort only after a
  // definite refusal: a completion that got no answer may still commit on the server, and an
  // abort racing it would delete the parts its object uses. Left as it is, an upload that
  // never completes is dropped by the gateway's multipart expiry.
  const completeUrl = "/upload/complete?" + target(section, key, { upload: upload });
  const completed = await tried(() => send("POST", completeUrl, csrf, lines.join("\n"), "text/plain", null));
  if (completed.status >= 400 && completed.status < 500) {
    await send("POST", "/upload/abort?" + target(section, key, { upload: upload }), csrf, null, null);
  }
  return completed;
}

async function uploadOne(section, file, list) {
  const key = section.dataset.prefix + file.name;
  const item = document.createElement("li");
  const name = document.createElement("span");
  name.textContent = key;
  const bar = document.createElement("progress");
  bar.max = file.size || 1;
  bar.value = 0;
  const status = document.createElement("span");
  status.className = "status";
  item.append(name, bar, status);
  list.append(item);
  const progress = (loaded) => {
    bar.value = loaded;
    status.textContent = Math.floor((100 * loaded) / (file.size || 1)) + "%";
  };
  const plan = partPlan(file.size);
  let answer;
  if (plan.error) {
    answer = { status: 0, text: plan.error };
  } else if (plan.parts === 1) {
    answer = await send("PUT", "/upload?" + target(section, key, {}), section.dataset.csrf, file, file.type, progress);
  } else {
    status.textContent = "0% (" + plan.parts + " parts)";
    answer = await uploadParts(section, file, key, plan, progress);
  }
  const ok = answer.status === 200;
  item.className = ok ? "done" : "failed";
  bar.value = ok ? bar.max : bar.value;
  status.textContent = ok ? "uploaded" : "failed: " + answer.text;
  return ok;
}

async function uploadAll(section, files) {
  const list = document.getElementById("uploads");
  let allOk = true;
  for (const file of files) {
    // One at a time: each streams into the cluster with bounded memory on the gateway.
    allOk = (await uploadOne(section, file, list)) && allOk;
  }
  if (allOk) {
    window.location.reload();
  }
}

// The cluster page's live charts (uPlot, vendored): the gateway's throughput, and its request
// rate with their mean latency, from /cluster/traffic every 2 s. Draws nothing without uPlot.
const CHART_POLL_MS = 2000;

function chartData(series) {
  return {
    throughput: [series.time, series.received_mb_s, series.sent_mb_s],
    latency: [series.time, series.mean_latency_ms, series.requests_s],
  };
}

function startCharts(section) {
  if (typeof uPlot === "undefined") {
    return;
  }
  const width = Math.max(300, section.clientWidth);
  const time = { label: "time" };
  let plots = null;
  const draw = (series) => {
    const data = chartData(series);
    if (plots === null) {
      plots = {
        throughput: new uPlot({
          title: "Throughput (MB/s)", width: width, height: 220,
          series: [time, { label: "received", stroke: "#2563eb", width: 2 }, { label: "sent", stroke: "#16a34a", width: 2 }],
          axes: [{}, { label: "MB/s" }],
        }, data.throughput, document.getElementById("throughput-chart")),
        latency: new uPlot({
          title: "Requests and their mean latency", width: width, height: 220,
          scales: { ms: {}, rps: {} },
          series: [time,
            { label: "mean latency (ms)", stroke: "#dc2626", width: 2, scale: "ms", spanGaps: false },
            { label: "requests/s", stroke: "#6b7280", width: 1, scale: "rps" }],
          axes: [{}, { scale: "ms", label: "ms" }, { scale: "rps", side: 1, label: "requests/s", grid: { show: false } }],
        }, data.latency, document.getElementById("latency-chart")),
      };
    } else {
      plots.throughput.setData(data.throughput);
      plots.latency.setData(data.latency);
    }
    section.dataset.points = String(series.time.length);
  };
  const poll = () => {
    fetch(section.dataset.src, { credentials: "same-origin" })
      .then((answer) => (answer.ok ? answer.json() : null))
      .then((series) => series && draw(series))
      .catch(() => {});
  };
  poll();
  window.setInterval(poll, CHART_POLL_MS);
}

// A page with a #refresh[data-refresh-ms] (the cluster page) updates its [data-live] parts in
// place: it fetches itself again and swaps in the parts with the same ids, so the charts keep
// their state and the reader their scroll position. A page without those parts (the session
// ended: the login page) is shown by reloading. Hidden tabs do not poll; a tab shown again
// updates at once. A request gets two intervals to answer, then counts as unanswered.
function startLiveRefresh(note) {
  const everyMs = Number(note.dataset.refreshMs);
  const told = note.textContent;
  const clock = () => new Date().toLocaleTimeString();
  let busy = false;
  const refresh = () => {
    if (busy || document.hidden) {
      return;
    }
    busy = true;
    const timeout = new AbortController();
    const timer = window.setTimeout(() => timeout.abort(), 2 * everyMs);
    fetch(window.location.href, { credentials: "same-origin", cache: "no-store", signal: timeout.signal })
      .then((answer) => answer.text().then((text) => ({ answer: answer, text: text })))
      .then(({ answer, text }) => {
        const fresh = new DOMParser().parseFromString(text, "text/html");
        const parts = Array.from(document.querySelectorAll("[data-live]"));
        if (answer.redirected || (answer.ok && parts.some((part) => !fresh.getElementById(part.id)))) {
          window.location.reload(); // to the login page
          return;
        }
        if (!answer.ok) {
          throw new Error("the gateway answered " + answer.status);
        }
        for (const part of parts) {
          part.replaceWith(document.adoptNode(fresh.getElementById(part.id)));
        }
        note.textContent = told + " Updated at " + clock() + ".";
        note.classList.remove("error");
      })
      .catch((error) => {
        const why = error.name === "AbortError" ? "the gateway did not answer in time"
          : error.name === "TypeError" ? "the gateway could not be reached" : error.message;
        note.textContent = told + " No update at " + clock() + " (" + why + "); what is shown may be stale.";
        note.classList.add("error");
      })
      .finally(() => {
        window.clearTimeout(timer);
        busy = false;
      });
  };
  window.setInterval(refresh, everyMs);
  document.addEventListener("visibilitychange", refresh);
}

document.addEventListener("DOMContentLoaded", () => {
  const charts = document.getElementById("charts");
  if (charts) {
    startCharts(charts);
  }
  const refreshNote = document.getElementById("refresh");
  if (refreshNote && refreshNote.dataset.refreshMs) {
    startLiveRefresh(refreshNote);
  }
  const section = document.getElementById("upload");
  if (!section) {
    return;
  }
  const picker = document.getElementById("files");
  picker.addEventListener("change", () => uploadAll(section, Array.from(picker.files)));
  section.addEventListener("dragover", (event) => {
    event.preventDefault();
    section.classList.add("over");
  });
  section.addEventListener("dragleave", () => section.classList.remove("over"));
  section.addEventListener("drop", (event) => {
    event.preventDefault();
    section.classList.remove("over");
    uploadAll(section, Array.from(event.dataTransfer.files));
  });
});
