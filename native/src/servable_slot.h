// The version in service (hot reload): read once per call, swapped whole; a call keeps the
// version it read until it is answered.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "servable.h"

namespace mitt::native {

class ServableSlot {
 public:
  ServableSlot(std::shared_ptr<const Servable> servable, std::string model_info)
      : servable_(std::move(servable)), model_info_(std::make_shared<const std::string>(std::move(model_info))) {}

  std::shared_ptr<const Servable> current() const {
    std::lock_guard<std::mutex> lock(mu_);
    return servable_;
  }
  // The serialized ModelInfo GetModelInfo answers.
  std::shared_ptr<const std::string> model_info() const {
    std::lock_guard<std::mutex> lock(mu_);
    return model_info_;
  }
  // Puts `servable` in service; the calls checked with the previous one finish on it.
  void Swap(std::shared_ptr<const Servable> servable, std::string model_info) {
    auto info = std::make_shared<const std::string>(std::move(model_info));
    std::lock_guard<std::mutex> lock(mu_);
    servable_.swap(servable);
    model_info_.swap(info);
  }  // the previous version is released here, outside the lock, once no call holds it
  // A new ModelInfo for the same version (a refused reload counted in it).
  void SetModelInfo(std::string model_info) {
    auto info = std::make_shared<const std::string>(std::move(model_info));
    std::lock_guard<std::mutex> lock(mu_);
    model_info_.swap(info);
  }

 private:
  mutable std::mutex mu_;
  std::shared_ptr<const Servable> servable_;
  std::shared_ptr<const std::string> model_info_;
};

}  // namespace mitt::native
