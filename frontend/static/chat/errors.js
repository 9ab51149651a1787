// API errors in sentences that name the field, as the person knows it ("Max tokens must be
// between 1 and 4096."), from the error shape the server answers (`field`, and a message
// that starts with "<field>: ").

import { ApiError } from "./api.js";

const LABELS = {
  content: "The message",
  params: "The generation settings",
  "params.max_tokens": "Max tokens",
  "params.simulation": "The simulation settings",
};

function label(field) {
  if (LABELS[field]) return LABELS[field];
  const simulation = /^params\.simulation\.(.+)$/.exec(field);
  if (simulation) return `The simulation setting "${simulation[1]}"`;
  return field;
}

function sentence(text) {
  return /[.!?…]$/.test(text) ? text : `${text}.`;
}

const UNREACHABLE =
  "The server could not be reached. This message goes away by itself once it is back.";
// What a proxy in front of the server answers when the server is down or slow.
const GATEWAY = [502, 503, 504];

/** Whether `error` says the server could not be reached: no answer at all, or a proxy's
 * 502/503/504 page (a body that is not the server's own error). */
export function unreachable(error) {
  return !(error instanceof ApiError) || (error.code === "error" && GATEWAY.includes(error.status));
}

/** What went wrong, for a banner. */
export function describe(error) {
  if (unreachable(error)) return UNREACHABLE;
  if (error.status >= 500 && (error.code === "error" || error.code === "server_error")) {
    return `The server failed to handle this (${error.status}). Try again in a moment; what you typed is kept.`;
  }
  if (!error.field) return sentence(error.message.charAt(0).toUpperCase() + error.message.slice(1));
  const prefix = `${error.field}: `;
  const detail = error.message.startsWith(prefix) ? error.message.slice(prefix.length) : error.message;
  // "must be …" continues the field's name; a sentence of its own follows a colon.
  const joined = /^[a-z]/.test(detail) ? `${label(error.field)} ${detail}` : `${label(error.field)}: ${detail}`;
  return sentence(joined);
}
