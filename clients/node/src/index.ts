// ringlock: the client for Node.js. See README.md.
export { Client, Lock } from "./client.js";
export type { AcquireOptions, ClientOptions, InspectReply, PingReply } from "./client.js";
export type { Key, Wait } from "./core.js";
export { ProtocolError } from "./core.js";
export * from "./errors.js";
export { Clusters, clusterFor, clusterScore } from "./clusters.js";
