// Sign-in: trade an admin key for a session cookie, then load the console.
"use strict";

const form = document.getElementById("sign-in-form");
const flash = document.getElementById("flash");

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  flash.hidden = true;
  const key = document.getElementById("admin-key").value.trim();
  try {
    const resp = await fetch("/api/v1/session", {
      method: "POST",
      credentials: "same-origin",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ key }),
    });
    if (resp.ok) {
      location.reload();
      return;
    }
    const body = await resp.json().catch(() => ({}));
    const message = (body.error && body.error.message) || `sign-in failed (${resp.status})`;
    // An unknown key is most often one made for another database (another --config).
    const hint = resp.status === 401 ? " Was it created for this server's database? Keys made with another --config (or none) live in another database." : "";
    show(message + "." + hint);
  } catch (e) {
    show(`rota could not be reached: ${e.message}`);
  }
});

function show(message) {
  flash.textContent = message;
  flash.dataset.kind = "error";
  flash.hidden = false;
}
