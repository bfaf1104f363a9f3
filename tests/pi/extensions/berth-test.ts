// A Pi extension for berth's real-Pi tests (tests/api/pi.rs), loaded with `pi -e <this file>`.
//
// `/confirm-me [title]` asks a `confirm` dialog (an `extension_ui_request` that waits for an
// `extension_ui_response`), then reports the answer with `notify`, so a test sees that the answer reached
// the agent. `/notice [text]` only sends fire-and-forget requests: `notify`, `setStatus`, `setTitle`.
// Extension commands sent as a `prompt` run at once (even while the agent streams) and never call the
// model.
import type { ExtensionAPI } from "@mariozechner/pi-coding-agent";

export default function (pi: ExtensionAPI) {
  pi.registerCommand("confirm-me", {
    description: "Ask a confirm dialog, then notify the answer (berth tests)",
    handler: async (args, ctx) => {
      const confirmed = await ctx.ui.confirm(args || "Proceed?", "berth test dialog");
      ctx.ui.notify(`confirmed: ${confirmed}`, "info");
    },
  });

  pi.registerCommand("notice", {
    description: "Send notify, setStatus and setTitle only (berth tests)",
    handler: async (args, ctx) => {
      const text = args || "hello from berth-test";
      ctx.ui.notify(text, "info");
      ctx.ui.setStatus("berth-test", `status: ${text}`);
      ctx.ui.setTitle(`title: ${text}`);
    },
  });
}
