// Who may call, and how often (retrieval.serving.access, auth, ratelimit): each call's caller is
// identified from its metadata and TLS peer alone (a bearer token's SHA-256, else a client
// certificate's name, against the identities of the access file, which Python parses and hands
// over again on each reload), authorized for its method, and rate-limited, in the Python
// engine's order and with its messages.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "admission.h"
#include "call_metrics.h"
#include "python_text.h"
#include "rate_limiter.h"

namespace mitt::native {

// auth.Identity: a caller.
struct Identity {
  std::string name;
  std::vector<std::string> permissions;  // auth.PERMISSIONS' names
  std::optional<double> rate, burst;  // its own rate limit; nullopt: the server's
  bool anonymous = false;             // a client address, not an identity of the access file

  // Whether it holds `permission` (an anonymous caller holds every one).
  bool Has(std::string_view permission) const;
  // access.identity_label: the `identity` label of its calls' metrics ("" when anonymous).
  std::string_view label() const { return anonymous ? std::string_view() : std::string_view(name); }
};

// auth.Identities: an access file's identities by the SHA-256 of their tokens (32 bytes) and by
// certificate name.
struct Identities {
  std::unordered_map<std::string, std::shared_ptr<const Identity>> by_token, by_certificate;
};

struct AccessOptions {
  std::optional<std::pair<double, double>> rate_limit;  // (rate, burst); nullopt: no limit
  // auth.METHOD_PERMISSIONS: full method name -> the permission it needs (else "admin").
  std::unordered_map<std::string, std::string> method_permissions;
};

class AccessControl {
 public:
  AccessControl(const PythonText& text, const AccessOptions& options);

  // The access file's identities from the next call on (nullptr: none, anyone may call anything).
  void SetIdentities(std::shared_ptr<const Identities> identities);
  // Whether calls are checked at all: an access file or a rate limit.
  bool checks() const;

  // AccessControl.identify, from the call's `metadata`, its peer and TLS peer: sets `caller` (nullptr when nothing is checked: no access file and no
  // rate limit, an anonymous caller with every permission), or refuses: UNAUTHENTICATED, or
  // rate_limit for a caller not identified whose address's bucket is empty.
  std::optional<Refusal> Identify(const grpc::ServerContextBase& context,
                                  const std::multimap<grpc::string_ref, grpc::string_ref>& metadata,
                                  std::shared_ptr<const Identity>* caller);
  // AccessControl.allow: PERMISSION_DENIED, or rate_limit with its pushback (a call refused its
  // permission takes no token).
  std::optional<Refusal> Allow(Method method, const Identity* caller);

 private:
  std::shared_ptr<const Identities> identities() const;
  // A token from `identity`'s bucket, else rate_limit (worded for callers not identified when
  // `unauthenticated`).
  std::optional<Refusal> Limit(const Identity& identity, bool unauthenticated);

  const PythonText& text_;
  std::optional<RateLimiter> limiter_;
  std::vector<std::string> needed_;  // by Method: the permission it needs
  mutable std::mutex mu_;
  std::shared_ptr<const Identities> identities_;  // under mu_
};

// access.peer_host: the address of a gRPC peer string without its port ("ipv4:10.0.0.5:41234" ->
// "10.0.0.5", "ipv6:[::1]:41234" -> "::1").
std::string PeerHost(std::string_view peer);

// auth.bearer_token: the token of the first "authorization: Bearer <token>" entry, if any.
std::optional<std::string> BearerToken(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata);

// auth.token_digest: the SHA-256 (32 bytes) a token is looked up by.
std::string TokenDigest(std::string_view token);

}  // namespace mitt::native
