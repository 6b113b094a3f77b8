// Shows every <time datetime="..."> in the viewer's own time zone (the server sends UTC).
document.querySelectorAll("time[datetime]").forEach(function (el) {
  var d = new Date(el.getAttribute("datetime"));
  if (!isNaN(d)) {
    el.textContent = d.toLocaleString(undefined, {dateStyle: "medium", timeStyle: "short"});
    el.title = el.getAttribute("datetime");
  }
});
// The start-a-job form: show only the fields of the chosen privacy unit.
var unit = document.getElementById("privacy");
if (unit) {
  var sync = function () {
    document.querySelectorAll("[data-unit]").forEach(function (box) {
      box.hidden = box.getAttribute("data-unit") !== unit.value;
    });
  };
  unit.addEventListener("change", sync);
  sync();
}
