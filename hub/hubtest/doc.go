// Package hubtest runs a fake Hugging Face Hub on 127.0.0.1 for tests.
//
// It speaks the parts of the Hub's HTTP protocol that model downloads use, closely enough that both
// our hub package and Python's huggingface_hub can download from it:
//
//   - GET  /api/models/{repo}/revision/{rev}          repository info: "sha" and "siblings" (with
//     sizes, blob IDs and LFS info when ?blobs=true)
//   - GET  /api/models/{repo}/tree/{rev}[/{dir}]        file listing, paginated with a Link header
//   - HEAD|GET /{repo}/resolve/{rev}/{path}             file metadata and content: X-Repo-Commit, ETag
//     (the git blob ID), Range requests; LFS files answer 302 to a separate "CDN" server with
//     X-Linked-Etag (the sha256) and X-Linked-Size
//   - GET  {cdn}/repos/{sha256}?...&Signature=...       LFS content, Range requests, signed URLs
//
// Access rules follow the real Hub's answers: private and missing repositories answer 401 without a
// token and 404 with one (X-Error-Code: RepoNotFound); gated repositories answer 401 without a token
// and 403 for an account that has not been granted access (X-Error-Code: GatedRepo); a token the
// server does not know answers 401 "Invalid credentials in Authorization header".
//
// The "CDN" listens on its own port, so it is another origin, as on the real Hub: clients must not
// send the Authorization header there, and the server records every request so tests can check it.
// Faults (cut connections, stalls, slow transfers) can be injected per file for resume and
// concurrency tests.
package hubtest
