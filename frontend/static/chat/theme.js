// Light or dark: as the system says (the default), or chosen with the header's switch,
// which goes System -> Light -> Dark and is remembered (`localStorage` "chat.theme").
// The page's colours follow `data-theme` on <html>; the code colours are highlight.js's
// two vendored styles, switched by their `media`.

const KEY = "chat.theme";
const ORDER = ["system", "light", "dark"];
const NAMES = { system: "as the system", light: "light", dark: "dark" };
const MARKS = { system: "◐", light: "☀", dark: "☾" };

export function storedTheme() {
  const theme = localStorage.getItem(KEY);
  return ORDER.includes(theme) ? theme : "system";
}

export function applyTheme(theme, button) {
  const root = document.documentElement;
  if (theme === "system") delete root.dataset.theme;
  else root.dataset.theme = theme;
  const light = document.getElementById("code-light");
  const dark = document.getElementById("code-dark");
  light.media = theme === "system" ? "(prefers-color-scheme: light)" : theme === "light" ? "all" : "not all";
  dark.media = theme === "system" ? "(prefers-color-scheme: dark)" : theme === "dark" ? "all" : "not all";
  button.textContent = MARKS[theme];
  button.setAttribute("aria-label", `Theme: ${NAMES[theme]}`);
  button.title = `Theme: ${NAMES[theme]} (click to change)`;
}

export function themeSwitch(button) {
  let theme = storedTheme();
  applyTheme(theme, button);
  button.addEventListener("click", () => {
    theme = ORDER[(ORDER.indexOf(theme) + 1) % ORDER.length];
    if (theme === "system") localStorage.removeItem(KEY);
    else localStorage.setItem(KEY, theme);
    applyTheme(theme, button);
  });
}
