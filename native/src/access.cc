#include "access.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include <openssl/evp.h>

namespace mitt::native {
namespace {

// Python's str.strip() of ASCII text: the characters str.isspace() holds for below 128.
std::string_view Strip(std::string_view text) {
  constexpr std::string_view kSpace = " \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f";
  const size_t first = text.find_first_not_of(kSpace);
  if (first == std::string_view::npos) return {};
  return text.substr(first, text.find_last_not_of(kSpace) - first + 1);
}

// Python's f"{value:g}".
std::string General(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", value);
  return text;
}

Refusal Unauthenticated(std::string message, std::string reason) {
  return {std::move(reason), std::move(message), std::nullopt, grpc::StatusCode::UNAUTHENTICATED};
}

}  // namespace

bool Identity::Has(std::string_view permission) const {
  return anonymous || std::find(permissions.begin(), permissions.end(), permission) != permissions.end();
}

AccessControl::AccessControl(const PythonText& text, const AccessOptions& options) : text_(text) {
  if (options.rate_limit) limiter_.emplace(options.rate_limit->first, options.rate_limit->second);
  for (Method method : {Method::kRetrieve, Method::kBatchRetrieve, Method::kGetModelInfo, Method::kServerReflectionInfo}) {
    const auto found = options.method_permissions.find(FullMethodName(method));
    needed_.push_back(found == options.method_permissions.end() ? "admin" : found->second);
  }
}

void AccessControl::SetIdentities(std::shared_ptr<const Identities> identities) {
  std::lock_guard<std::mutex> lock(mu_);
  identities_.swap(identities);
}

std::shared_ptr<const Identities> AccessControl::identities() const {
  std::lock_guard<std::mutex> lock(mu_);
  return identities_;
}

bool AccessControl::checks() const { return limiter_.has_value() || identities() != nullptr; }

std::optional<Refusal> AccessControl::Identify(const grpc::ServerContextBase& context,
                                               const std::multimap<grpc::string_ref, grpc::string_ref>& metadata,
                                               std::shared_ptr<const Identity>* caller) {
  const std::shared_ptr<const Identities> identities = this->identities();
  if (identities == nullptr) {
    // Without an access file the caller is its address: known only when a rate limit needs it.
    if (limiter_) *caller = std::make_shared<const Identity>(Identity{PeerHost(context.peer()), {}, {}, {}, true});
    return std::nullopt;
  }
  std::optional<Refusal> refused;
  if (const auto token = BearerToken(metadata)) {
    const auto found = identities->by_token.find(TokenDigest(*token));
    if (found != identities->by_token.end()) {
      *caller = found->second;
      return std::nullopt;
    }
    refused = Unauthenticated("invalid bearer token", "invalid_token");
  } else {
    if (const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context()) {
      for (const char* key : {"x509_common_name", "x509_subject_alternative_name"}) {
        for (const grpc::string_ref& name : auth->FindPropertyValues(key)) {
          const auto found = identities->by_certificate.find(std::string(name.data(), name.size()));
          if (found != identities->by_certificate.end()) {
            *caller = found->second;
            return std::nullopt;
          }
        }
      }
    }
    refused = Unauthenticated("missing credentials: send 'authorization: Bearer <token>' metadata",
                              "missing_credentials");
  }
  // A caller not identified first takes a token from its address's bucket: a flood of bad
  // credentials is rate-limited too.
  if (auto limited = Limit(Identity{PeerHost(context.peer()), {}, {}, {}, true}, true)) return limited;
  return refused;
}

std::optional<Refusal> AccessControl::Allow(Method method, const Identity* caller) {
  if (caller == nullptr) return std::nullopt;
  const std::string& needed = needed_[static_cast<size_t>(method)];
  if (!caller->Has(needed) && !caller->Has("admin")) {
    return Refusal{"permission",
                   "identity " + text_.Repr(caller->name) + " may not call " + MethodName(method) +
                       " (needs permission " + text_.Repr(needed) + ")",
                   std::nullopt, grpc::StatusCode::PERMISSION_DENIED};
  }
  return Limit(*caller, false);
}

std::optional<Refusal> AccessControl::Limit(const Identity& identity, bool unauthenticated) {
  if (!limiter_) return std::nullopt;
  const double wait = limiter_->Wait({identity.anonymous, identity.name}, identity.rate, identity.burst);
  if (wait <= 0) return std::nullopt;
  const auto [rate, burst] = limiter_->Limit(identity.rate, identity.burst);
  const double pushback = std::max(1.0, std::nearbyint(wait * 1000));  // round() of Python: ties to even
  const std::string caller = unauthenticated ? "unauthenticated calls from " + identity.name
                                                              : "identity " + text_.Repr(identity.name);
  return Refusal{"rate_limit",
                 "rate limit of " + General(rate) + " requests/s (burst " + General(burst) + ") for " + caller +
                     " exceeded, retry in " + std::to_string(static_cast<int64_t>(pushback)) + " ms",
                 pushback / 1000};
}

std::string PeerHost(std::string_view peer) {
  const size_t colon = peer.find(':');
  const std::string_view address = colon == std::string_view::npos || colon + 1 == peer.size() ? peer : peer.substr(colon + 1);
  const size_t last = address.rfind(':');
  std::string_view host = last == std::string_view::npos ? std::string_view() : address.substr(0, last);
  while (!host.empty() && (host.front() == '[' || host.front() == ']')) host.remove_prefix(1);
  while (!host.empty() && (host.back() == '[' || host.back() == ']')) host.remove_suffix(1);
  return std::string(host.empty() ? address : host);
}

std::optional<std::string> BearerToken(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) {
  const auto [first, last] = metadata.equal_range("authorization");
  for (auto entry = first; entry != last; ++entry) {
    const std::string_view value(entry->second.data(), entry->second.size());
    const size_t space = value.find(' ');
    std::string scheme(value.substr(0, space));
    std::transform(scheme.begin(), scheme.end(), scheme.begin(), [](unsigned char c) { return std::tolower(c); });
    const std::string_view token = space == std::string_view::npos ? std::string_view() : Strip(value.substr(space + 1));
    if (scheme == "bearer" && !token.empty()) return std::string(token);
  }
  return std::nullopt;
}

std::string TokenDigest(std::string_view token) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (EVP_Digest(token.data(), token.size(), digest, &size, EVP_sha256(), nullptr) != 1) {
    throw std::runtime_error("SHA-256 failed");
  }
  return std::string(reinterpret_cast<const char*>(digest), size);
}

}  // namespace mitt::native
