// Shows the refusal of a failed login (the page is static: the server only redirects).
"use strict";
if (new URLSearchParams(location.search).has("failed")) {
  document.getElementById("failed").hidden = false;
}
