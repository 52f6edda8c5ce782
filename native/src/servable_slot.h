// The version in service (hot reload): read once per call, swapped whole; a call keeps the
// version it read until it is answered.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "servable.h"

namespace mitt::native {

// The serialized ModelInfo GetModelInfo answers: `whole` to callers with the admin permission
// (and to every caller without an access file), `cut` to the others (its last_refusal and
// access_file_error as server.public_refusal cuts them, in Python).
struct ModelInfos {
  std::string whole, cut;
};

class ServableSlot {
 public:
  ServableSlot(std::shared_ptr<const Servable> servable, ModelInfos model_info)
      : servable_(std::move(servable)), model_info_(std::make_shared<const ModelInfos>(std::move(model_info))) {}

  std::shared_ptr<const Servable> current() const {
    std::lock_guard<std::mutex> lock(mu_);
    return servable_;
  }
  std::shared_ptr<const ModelInfos> model_info() const {
    std::lock_guard<std::mutex> lock(mu_);
    return model_info_;
  }
  // Puts `servable` in service; the calls checked with the previous one finish on it.
  void Swap(std::shared_ptr<const Servable> servable, ModelInfos model_info) {
    auto info = std::make_shared<const ModelInfos>(std::move(model_info));
    std::lock_guard<std::mutex> lock(mu_);
    servable_.swap(servable);
    model_info_.swap(info);
  }  // the previous version is released here, outside the lock, once no call holds it
  // A new ModelInfo for the same version (a refused reload counted in it, the access file's state).
  void SetModelInfo(ModelInfos model_info) {
    auto info = std::make_shared<const ModelInfos>(std::move(model_info));
    std::lock_guard<std::mutex> lock(mu_);
    model_info_.swap(info);
  }

 private:
  mutable std::mutex mu_;
  std::shared_ptr<const Servable> servable_;
  std::shared_ptr<const ModelInfos> model_info_;
};

}  // namespace mitt::native
