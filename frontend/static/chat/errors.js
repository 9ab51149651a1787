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

/** What went wrong, for a banner. */
export function describe(error) {
  if (!(error instanceof ApiError)) {
    return "The server could not be reached. This message goes away by itself once it is back.";
  }
  if (!error.field) return sentence(error.message.charAt(0).toUpperCase() + error.message.slice(1));
  const prefix = `${error.field}: `;
  const detail = error.message.startsWith(prefix) ? error.message.slice(prefix.length) : error.message;
  // "must be …" continues the field's name; a sentence of its own follows a colon.
  const joined = /^[a-z]/.test(detail) ? `${label(error.field)} ${detail}` : `${label(error.field)}: ${detail}`;
  return sentence(joined);
}
