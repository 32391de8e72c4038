/* django-rcoord guild-member autocomplete: a WAI-ARIA combobox with a list popup.
 * Plain JavaScript, no dependency. Listens on the document, so inputs added later
 * (admin inline formsets) work too. Down/Up move, Enter picks, Escape closes. */
(function () {
  "use strict";
  var SELECTOR = "input[data-rcoord-autocomplete]";
  var DEBOUNCE_MS = 150;
  var states = new WeakMap();
  var counter = 0;

  function parts(input) {
    var wrapper = input.closest(".rcoord-autocomplete");
    var listbox = wrapper && wrapper.querySelector("[role=listbox]");
    var live = wrapper && wrapper.querySelector("[role=status]");
    if (listbox && !listbox.id) {
      listbox.id = "rcoord-listbox-" + (++counter);
    }
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
    }
    return s;
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
})();
