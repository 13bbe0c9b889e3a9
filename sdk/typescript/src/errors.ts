/** Errors from the server, by status, as the Python SDK has them. */

export class KennelError extends Error {
  /** The HTTP status, or null for an `error` event that ended a stream. */
  readonly status: number | null;
  /** The server's error code (`bad_request`, `not_found`, `busy`, ...). */
  readonly code: string;

  constructor(status: number | null, code: string, message: string) {
    super(message);
    this.name = new.target.name;
    this.status = status;
    this.code = code;
  }
}

/** 400: a malformed request, or one outside the server's bounds. */
export class BadRequest extends KennelError {}
/** 401: a missing or wrong bearer token. */
export class Unauthorized extends KennelError {}
/** 403: something this token may not use (an image, say). */
export class Forbidden extends KennelError {}
/** 404: no such session (for this token), file or directory. */
export class NotFound extends KennelError {}
/** 409: a session name this token's open session has, or (`getOrCreate`) one whose spec
 * differs; the message names the name or the fields. */
export class Conflict extends KennelError {}
/** 410: the session's sandbox has ended. */
export class SessionEnded extends KennelError {}
/** 413: larger than the server or the session takes. */
export class TooLarge extends KennelError {}

/** 429: the server or this token is at capacity; retry after `retryAfter` seconds. */
export class Busy extends KennelError {
  readonly retryAfter: number | null;

  constructor(status: number | null, code: string, message: string, retryAfter: number | null) {
    super(status, code, message);
    this.retryAfter = retryAfter;
  }
}

const BY_STATUS: Record<number, typeof KennelError> = {
  400: BadRequest,
  401: Unauthorized,
  403: Forbidden,
  404: NotFound,
  409: Conflict,
  410: SessionEnded,
  413: TooLarge,
};

/** The error a failed response stands for, from its body (`{"error": {"code", "message"}}`). */
export async function errorFrom(response: Response): Promise<KennelError> {
  const text = await response.text();
  let code = "error";
  let message = text || response.statusText;
  try {
    const body = JSON.parse(text) as { error?: { code?: string; message?: string } };
    code = body.error?.code ?? code;
    message = body.error?.message ?? message;
  } catch {
    // not JSON: the body itself is the message
  }
  if (response.status === 429) {
    const after = Number(response.headers.get("retry-after"));
    return new Busy(429, code, message, Number.isFinite(after) && after > 0 ? after : null);
  }
  return errorFor(response.status, code, message);
}

/** @internal The most specific error class for a status (not 429, which has its wait). */
export function errorFor(status: number | null, code: string, message: string): KennelError {
  const Kind = (status !== null && BY_STATUS[status]) || KennelError;
  return new Kind(status, code, message);
}
