/**
 * Checks a callback from Kennel as the Standard Webhooks specification says: the
 * `webhook-signature` header holds `v1,<base64 HMAC-SHA256>` of `{id}.{timestamp}.{body}` under
 * the secret (`whsec_` + base64), and `webhook-timestamp` must be recent. WebCrypto only.
 */

import { runInfo, type RunInfo } from "./results.js";
import type { components } from "./openapi.js";

/** The callback is not Kennel's: a wrong signature, a stale timestamp, missing headers. */
export class WebhookVerificationError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "WebhookVerificationError";
  }
}

type Headers_ = Headers | Record<string, string | undefined>;

function header(headers: Headers_, name: string): string {
  const value = headers instanceof Headers
    ? headers.get(name) ?? undefined
    : Object.entries(headers).find(([k]) => k.toLowerCase() === name)?.[1];
  if (value === undefined) throw new WebhookVerificationError(`no ${name} header`);
  return value;
}

function b64(bytes: Uint8Array): string {
  return btoa(String.fromCharCode(...bytes));
}

/** Constant time over equal lengths. */
function same(a: string, b: string): boolean {
  if (a.length !== b.length) return false;
  let diff = 0;
  for (let i = 0; i < a.length; i++) diff |= a.charCodeAt(i) ^ b.charCodeAt(i);
  return diff === 0;
}

/**
 * The run a callback reports, once its signature and timestamp check out (`tolerance`
 * seconds, 300 by default, either way of `now`); throws {@link WebhookVerificationError}
 * otherwise.
 */
export async function verifyWebhook(
  secret: string,
  headers: Headers_,
  body: string | Uint8Array,
  options: { tolerance?: number; now?: number } = {},
): Promise<RunInfo> {
  if (!secret.startsWith("whsec_")) throw new WebhookVerificationError("the secret must start with whsec_");
  const key = Uint8Array.from(atob(secret.slice(6)), (c) => c.charCodeAt(0));
  const raw = typeof body === "string" ? new TextEncoder().encode(body) : body;
  const id = header(headers, "webhook-id");
  const timestamp = Number(header(headers, "webhook-timestamp"));
  if (!Number.isInteger(timestamp)) throw new WebhookVerificationError("webhook-timestamp is not a number");
  const now = options.now ?? Date.now() / 1000;
  if (Math.abs(now - timestamp) > (options.tolerance ?? 300)) {
    throw new WebhookVerificationError("webhook-timestamp is too old or too new");
  }
  const prefix = new TextEncoder().encode(`${id}.${timestamp}.`);
  const signed = new Uint8Array(prefix.length + raw.length);
  signed.set(prefix);
  signed.set(raw, prefix.length);
  const hmacKey = await crypto.subtle.importKey("raw", key, { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
  const expected = b64(new Uint8Array(await crypto.subtle.sign("HMAC", hmacKey, signed)));
  // The header may hold several space-separated signatures (a key being rotated).
  const ok = header(headers, "webhook-signature")
    .split(" ")
    .some((sig) => sig.startsWith("v1,") && same(sig.slice(3), expected));
  if (!ok) throw new WebhookVerificationError("no signature matches");
  return runInfo(JSON.parse(new TextDecoder().decode(raw)) as components["schemas"]["RunInfo"]);
}
