// The console's only script: uploads with progress (drag and drop or the file picker).
// Each file is one PUT /upload?bucket=B&key=K with the session's CSRF token in a header;
// the page reloads once every upload has ended, so the listing shows the new objects.
"use strict";

function uploadOne(section, file, list) {
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
  return new Promise((resolve) => {
    const xhr = new XMLHttpRequest();
    const query = new URLSearchParams({ bucket: section.dataset.bucket, key: key });
    xhr.open("PUT", "/upload?" + query.toString());
    xhr.setRequestHeader("x-csrf-token", section.dataset.csrf);
    if (file.type) {
      xhr.setRequestHeader("content-type", file.type);
    }
    xhr.upload.onprogress = (event) => {
      bar.value = event.loaded;
      status.textContent = Math.floor((100 * event.loaded) / (event.total || 1)) + "%";
    };
    xhr.onload = () => {
      const ok = xhr.status === 200;
      item.className = ok ? "done" : "failed";
      bar.value = ok ? bar.max : bar.value;
      status.textContent = ok ? "uploaded" : "failed: " + xhr.responseText;
      resolve(ok);
    };
    xhr.onerror = () => {
      item.className = "failed";
      status.textContent = "failed: the connection broke";
      resolve(false);
    };
    xhr.send(file);
  });
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

document.addEventListener("DOMContentLoaded", () => {
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
