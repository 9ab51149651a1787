// The composer's button: Send, and Stop in its place while an answer streams in the open
// conversation, as people know it from other chat apps. One button, not two: its place
// and the keyboard focus stay put when it changes, so what sent can stop. Enter in the
// message box never stops anything; it sends only while the button is Send and enabled.

export class SendButton {
  /** `button`: the composer form's submit button; `stop()`: stop what streams here. */
  constructor(button, stop) {
    this.button = button;
    this.stopping = false;
    button.addEventListener("click", (e) => {
      // As Send it submits the form (type "submit"); as Stop (type "button") it does not.
      // The second click of a double-click on Send can land after the answer has begun:
      // that is no Stop.
      if (this.stopping && e.detail < 2) stop();
    });
  }

  /** Stop while `streaming` (always enabled: a Stop is kept until it reaches the server),
   * else Send, enabled when `sendable`. */
  show(streaming, sendable) {
    const button = this.button;
    this.stopping = streaming;
    button.type = streaming ? "button" : "submit";
    button.dataset.action = streaming ? "stop" : "send";
    button.disabled = !streaming && !sendable;
    if (streaming) {
      button.setAttribute("aria-label", "Stop");
      button.title = "Stop the answer being written (Esc)";
    } else {
      button.removeAttribute("aria-label");
      button.removeAttribute("title");
    }
  }

  /** A message can be sent now (the button is Send, and enabled). */
  get sendable() {
    return !this.stopping && !this.button.disabled;
  }
}
