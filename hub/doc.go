// Package hub downloads model repositories from the Hugging Face Hub into the cache that Python's
// huggingface_hub uses, so models downloaded by either tool are found by the other.
//
// # Cache layout
//
// The cache is $HF_HUB_CACHE (default $HF_HOME/hub, HF_HOME default ~/.cache/huggingface):
//
//	models--org--name/blobs/{etag}                  file contents, named by the Hub's ETag: the
//	                                                sha256 for LFS files, the git blob ID otherwise
//	models--org--name/blobs/{etag}.incomplete       a download in progress (resumable)
//	models--org--name/snapshots/{commit}/{path}     relative symlinks to blobs, one folder per commit
//	models--org--name/refs/{branch or tag}          the commit it pointed at (no trailing newline)
//	.locks/models--org--name/{etag}.lock            flock(2)ed while a blob is written
//
// A snapshot folder is a complete model folder that loaders read directly. Nothing half-written is
// ever visible in it: blobs are written to .incomplete, checked (size, and sha256 for LFS files),
// fsynced and renamed, and only then linked. The lock file is the one huggingface_hub locks, so a
// Python process and ours never write the same blob at once.
//
// # Protocol
//
// Download lists a revision with GET {endpoint}/api/models/{repo}/revision/{rev}, which names the
// commit ("sha") and the files ("siblings"). Each file is then resolved at that commit with
// HEAD {endpoint}/{repo}/resolve/{commit}/{path}: X-Repo-Commit gives the commit, X-Linked-Etag (LFS
// files) or ETag the blob name, X-Linked-Size or Content-Length the size. LFS files answer with a
// redirect to a CDN; redirects within the Hub (renamed repositories) are followed, and the token is
// never sent to another origin. Interrupted transfers resume with "Range: bytes=N-" from the
// .incomplete file, within one call and across processes.
//
// # Environment
//
// LoadEnv reads the variables huggingface_hub reads: HF_ENDPOINT, HF_HOME, HF_HUB_CACHE,
// HF_TOKEN (else the token file $HF_HOME/token, or HF_TOKEN_PATH) and HF_HUB_OFFLINE. In offline
// mode everything comes from the cache, and a missing model is an ErrNotCached error.
//
// # Errors
//
// Failures are *Error values whose message says what to do, with a kind to test with errors.Is:
// ErrUnauthorized (401: token missing or rejected), ErrGated (license not accepted), ErrRepoNotFound,
// ErrRevisionNotFound and ErrEntryNotFound (all ErrNotFound), ErrUnreachable (cannot connect; the
// message suggests HF_HUB_OFFLINE=1), ErrNotCached, ErrIntegrity and ErrProtocol. Cancelling the
// context stops downloads promptly and leaves the partial file for the next attempt.
//
// The hubtest subpackage is a fake Hub for tests of this and other packages.
package hub
