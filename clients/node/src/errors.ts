// The client's errors: every one is a RinglockError, typed by what the caller
// can do about it.

/** Base class of every error the client throws. */
export class RinglockError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** A bad argument, refused before anything is sent: `argument` names it and
 * the message gives the accepted range. */
export class InvalidArgumentError extends RinglockError {
  constructor(
    readonly argument: string,
    message: string,
  ) {
    super(message);
  }
}

/** Why one address could not be used, as of its last attempt. */
export interface AddressFailure {
  address: string;
  /** What happened, in words: "connection refused", "closed by the server",
   * "auth-failed", "certificate not trusted: …". */
  reason: string;
  /** The Node error code ("ECONNREFUSED", "SELF_SIGNED_CERT_IN_CHAIN"…) or
   * the server's code ("auth-failed"), when there is one. */
  code?: string;
  /** The OS error number, when there is one. */
  errno?: number;
  /** The underlying error, when there is one. */
  cause?: unknown;
  kind: "connect" | "auth" | "tls";
}

/** No usable connection within the call's limit: says how long it waited and
 * names every address with the failure of its last attempt. */
export class ConnectionError extends RinglockError {
  constructor(
    message: string,
    readonly failures: AddressFailure[],
    readonly waitedMs: number,
    /** A stopping server answered the call shutting-down (it had no effect)
     * and no server took it again within its limit. */
    readonly shuttingDown = false,
  ) {
    super(message, { cause: failures.find((failure) => failure.cause !== undefined)?.cause });
  }
  /** The first address's failure code (as on a Node system error). */
  get code(): string | undefined {
    return this.failures[0]?.code;
  }
}

/** No connection could be made (refused, closed, timed out…). */
export class NoConnectionError extends ConnectionError {}
/** Every address refused the secret (auth-failed or auth-disabled). */
export class AuthenticationError extends ConnectionError {}
/** The TLS handshake failed (an untrusted certificate, a missing client
 * certificate…). */
export class TLSError extends ConnectionError {}

/** The servers know no active node (`M … -`) within the call's limit. */
export class NoActiveNodeError extends RinglockError {}

/** The acquire's wait ran out without a grant (the server answered T). */
export class LockTimeoutError extends RinglockError {
  constructor(readonly key: string) {
    super(`the wait for ${JSON.stringify(key)} ran out without a grant`);
  }
}

/** An error code answered by the server for one request (`E op key code`). */
export class ServerError extends RinglockError {
  constructor(
    readonly code: string,
    readonly op: string,
    readonly key: string,
    readonly address: string,
  ) {
    super(`${address} answered ${code} to ${op} ${JSON.stringify(key)}${SERVER_CODE_HINTS[code] ?? ""}`);
  }
}

/** What the message of a server's code adds, when the code alone does not
 * say what is accepted. */
const SERVER_CODE_HINTS: Record<string, string> = {
  "bad-lease": " (a lease is from 0.001 s to the server's --max-lease, default 86400 s)",
};
/** `not-holder`: the token does not hold the key (any more). */
export class NotHolderError extends ServerError {}
/** `forbidden`: the key is outside the authenticated name's scope. */
export class ForbiddenError extends ServerError {}
/** `shutting-down`: the server is stopping. */
export class ShuttingDownError extends ServerError {}

/** The client was closed. */
export class ClientClosedError extends RinglockError {
  constructor() {
    super("the client is closed");
  }
}

/** The lock's lease ran out without a confirmed extend, or the server said
 * it is no longer held: the reason of a lost lock's signal. */
export class LockLostError extends RinglockError {}

export function serverError(code: string, op: string, key: string, address: string): ServerError {
  switch (code) {
    case "not-holder":
      return new NotHolderError(code, op, key, address);
    case "forbidden":
      return new ForbiddenError(code, op, key, address);
    case "shutting-down":
      return new ShuttingDownError(code, op, key, address);
    default:
      return new ServerError(code, op, key, address);
  }
}
