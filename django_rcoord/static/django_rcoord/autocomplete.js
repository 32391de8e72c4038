/* django-rcoord guild-member autocomplete: a WAI-ARIA combobox with a list popup.
 * Plain JavaScript, no dependency. Listens on the document, so inputs added later
 * work too; Django admin's "formset:added" (a new inline row) sets the row's inputs
 * up at once. Down/Up move, Enter picks, Escape closes.
 *
 * A page may load this file more than once ({{ form.media }} and
 * {% rcoord_autocomplete_media %}, or two forms' media): only the first copy
 * sets up, so each keystroke burst sends one query. */
(function () {
  "use strict";
  if (window.djangoRcoordAutocomplete) { return; }
  var SELECTOR = "input[data-rcoord-autocomplete]";
  var DEBOUNCE_MS = 150;
  var GAP_PX = 2;       // between the input and its list
  var MARGIN_PX = 8;    // kept free at the viewport's edges
  var states = new WeakMap();
  var counter = 0;

  function parts(input) {
    var wrapper = input.closest(".rcoord-autocomplete");
    var listbox = wrapper && wrapper.querySelector("[role=listbox]");
    var live = wrapper && wrapper.querySelector("[role=status]");
    if (listbox && !listbox.id) {
      listbox.id = "rcoord-listbox-" + (++counter);
    }
    // A row cloned by the admin's inlines gets new ids but keeps the template
    // row's aria-controls: point it at this row's list again.
    if (listbox && input.getAttribute("aria-controls") !== listbox.id) {
      input.setAttribute("aria-controls", listbox.id);
    }
    return { listbox: listbox, live: live };
  }

  function state(input) {
    var s = states.get(input);
    if (!s) {
      s = { timer: null, controller: null, active: -1, options: [] };
      states.set(input, s);
      parts(input);
    }
    return s;
  }

  // Set up every autocomplete input in `root` (an element or the document).
  function setUp(root) {
    if (root.matches && root.matches(SELECTOR)) { state(root); }
    if (root.querySelectorAll) {
      Array.prototype.forEach.call(root.querySelectorAll(SELECTOR), state);
    }
  }

  // The list is fixed to the viewport, under the input (above it when there is more
  // room there), so containers that clip their overflow (the admin's form rows) do
  // not cut it. It is at least as wide as the input and as wide as its longest name
  // needs, up to the stylesheet's max-width.
  function place(input, listbox) {
    var box = input.getBoundingClientRect();
    listbox.style.minWidth = box.width + "px";
    var width = listbox.offsetWidth, height = listbox.offsetHeight;
    var viewWidth = document.documentElement.clientWidth;
    var viewHeight = document.documentElement.clientHeight;
    var left = Math.max(MARGIN_PX, Math.min(box.left, viewWidth - width - MARGIN_PX));
    var below = viewHeight - box.bottom - GAP_PX, above = box.top - GAP_PX;
    var top = height > below && above > below ? box.top - GAP_PX - height : box.bottom + GAP_PX;
    listbox.style.left = left + "px";
    listbox.style.top = top + "px";
  }

  function placeOpenLists() {
    Array.prototype.forEach.call(document.querySelectorAll(SELECTOR), function (input) {
      if (input.getAttribute("aria-expanded") === "true") {
        place(input, parts(input).listbox);
      }
    });
  }

  function close(input) {
    var p = parts(input), s = state(input);
    if (!p.listbox) { return; }
    p.listbox.hidden = true;
    p.listbox.textContent = "";
    s.options = [];
    s.active = -1;
    input.setAttribute("aria-expanded", "false");
    input.removeAttribute("aria-activedescendant");
  }

  function setActive(input, index) {
    var s = state(input);
    s.options.forEach(function (option, i) {
      option.setAttribute("aria-selected", i === index ? "true" : "false");
    });
    s.active = index;
    if (index >= 0) {
      input.setAttribute("aria-activedescendant", s.options[index].id);
      s.options[index].scrollIntoView({ block: "nearest" });
    } else {
      input.removeAttribute("aria-activedescendant");
    }
  }

  function pick(input, index) {
    var s = state(input);
    if (index < 0 || index >= s.options.length) { return; }
    input.value = s.options[index].textContent;
    close(input);
    input.dispatchEvent(new Event("change", { bubbles: true }));
  }

  function render(input, results) {
    var p = parts(input), s = state(input);
    p.listbox.textContent = "";
    s.options = results.map(function (name, i) {
      var option = document.createElement("span");
      option.setAttribute("role", "option");
      option.id = p.listbox.id + "-option-" + i;
      option.setAttribute("aria-selected", "false");
      option.textContent = name;
      option.title = name;  // shown in full when a very long name is cut
      option.addEventListener("mousedown", function (event) {
        event.preventDefault();  // keep the focus in the input
        pick(input, i);
      });
      p.listbox.appendChild(option);
      return option;
    });
    s.active = -1;
    input.removeAttribute("aria-activedescendant");
    var open = results.length > 0;
    p.listbox.hidden = !open;
    input.setAttribute("aria-expanded", open ? "true" : "false");
    if (open) {
      place(input, p.listbox);
      p.listbox.scrollTop = 0;  // new results start at the top, not where the old ones were
    }
    if (p.live) {
      p.live.textContent = results.length === 1 ? "1 suggestion" :
        results.length + " suggestions";
    }
  }

  function query(input) {
    var s = state(input);
    var text = input.value;
    if (s.controller) { s.controller.abort(); }  // a stale answer must not win
    if (!text) { close(input); return; }
    s.controller = new AbortController();
    var url = input.getAttribute("data-rcoord-autocomplete") +
      "?q=" + encodeURIComponent(text) +
      "&limit=" + encodeURIComponent(input.getAttribute("data-rcoord-limit") || "10");
    fetch(url, {
      credentials: "same-origin",
      headers: { Accept: "application/json" },
      signal: s.controller.signal
    }).then(function (response) {
      return response.ok ? response.json() : { results: [] };
    }).then(function (body) {
      if (input.value === text) { render(input, body.results || []); }
    }).catch(function (error) {
      if (error.name !== "AbortError") { close(input); }
    });
  }

  document.addEventListener("input", function (event) {
    var input = event.target;
    if (!input.matches || !input.matches(SELECTOR)) { return; }
    var s = state(input);
    clearTimeout(s.timer);
    s.timer = setTimeout(function () { query(input); }, DEBOUNCE_MS);
  });

  document.addEventListener("keydown", function (event) {
    var input = event.target;
    if (!input.matches || !input.matches(SELECTOR)) { return; }
    var s = state(input), open = input.getAttribute("aria-expanded") === "true";
    if (event.key === "ArrowDown") {
      if (open) { setActive(input, Math.min(s.active + 1, s.options.length - 1)); }
      else { query(input); }
      event.preventDefault();
    } else if (event.key === "ArrowUp" && open) {
      setActive(input, Math.max(s.active - 1, 0));
      event.preventDefault();
    } else if (event.key === "Enter" && open && s.active >= 0) {
      pick(input, s.active);
      event.preventDefault();  // picking is not submitting
    } else if (event.key === "Escape" && open) {
      close(input);
      event.preventDefault();
    }
  });

  document.addEventListener("focusout", function (event) {
    var input = event.target;
    if (input.matches && input.matches(SELECTOR)) { close(input); }
  });

  // Pressing on the list (its scrollbar included) must not take the focus from the input.
  document.addEventListener("mousedown", function (event) {
    if (event.target.closest && event.target.closest(".rcoord-listbox")) {
      event.preventDefault();
    }
  });

  // The list is fixed to the viewport: keep it under its input when anything scrolls.
  window.addEventListener("scroll", placeOpenLists, true);
  window.addEventListener("resize", placeOpenLists);

  document.addEventListener("formset:added", function (event) { setUp(event.target); });
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", function () { setUp(document); });
  } else {
    setUp(document);
  }

  window.djangoRcoordAutocomplete = { setUp: setUp };
})();
