// Why an answer ended, in words. The statuses are the server's termination record.

// Ends that are the answer as the model meant it: no indicator, no Continue.
export const NATURAL_ENDS = new Set(["complete", "stopped"]);

function seconds(value) {
  const n = Number(value);
  if (!Number.isFinite(n)) return "a while";
  return `${Math.round(n)} second${Math.round(n) === 1 ? "" : "s"}`;
}

/** The cut-off reason for a termination record, or null when the answer is whole. */
export function cutOffReason(termination, config) {
  const status = termination && termination.status;
  if (!status || status === "streaming" || NATURAL_ENDS.has(status)) return null;
  if (termination.context_full) return "The conversation fills the model's context";
  const reason = plainReason(status, termination, config);
  return termination.ended_in_reasoning ? `${reason} while thinking` : reason;
}

function plainReason(status, termination, config) {
  switch (status) {
    case "truncated":
      return "Max tokens reached";
    case "cancelled":
      return "Stopped by you";
    case "abandoned":
      return "Connection lost";
    case "error":
      return `Server error: ${termination.error_message || termination.error_type || "unknown error"}`;
    case "stalled":
      return `No tokens for ${seconds(config.stallTimeout)}`;
    case "interrupted":
      return "Server restarted";
    default:
      return `Ended: ${status}`;
  }
}

/** Whether a Continue can add to a cut-off answer: not when it fills the model's context. */
export function canContinue(termination) {
  return !(termination && termination.context_full);
}
