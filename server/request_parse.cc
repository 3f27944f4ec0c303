#include "server/request_parse.h"

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/common/log.h"
#include "engine/tokenizer/utf8.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"
#include "google/protobuf/dynamic_message.h"
#include "google/protobuf/stubs/logging.h"

namespace specula {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::FileDescriptorProto;
using google::protobuf::Message;
using google::protobuf::Reflection;
// The tokenizer's validator: the server and the tokenizer agree on what UTF-8 is.
using tokenizer_internal::FindInvalidUtf8;

void StringsToBytes(google::protobuf::DescriptorProto* message) {
  for (auto& field : *message->mutable_field()) {
    if (field.type() == google::protobuf::FieldDescriptorProto::TYPE_STRING) {
      field.set_type(google::protobuf::FieldDescriptorProto::TYPE_BYTES);
    }
  }
  for (auto& nested : *message->mutable_nested_type()) StringsToBytes(&nested);
}

// The "lenient twin" of each request type: the same message with every string field declared
// bytes, so it parses whatever UTF-8 the real one rejects and the offending field can be named.
class LenientTwins {
 public:
  static LenientTwins& Get() {
    static auto* twins = new LenientTwins();
    return *twins;
  }

  // A fresh twin of `real`'s type; null when its file imports others (not needed so far).
  std::unique_ptr<Message> New(const Descriptor* real) {
    std::lock_guard lock(mu_);
    const google::protobuf::FileDescriptor* file = real->file();
    if (pool_.FindFileByName(file->name()) == nullptr) {
      if (file->dependency_count() > 0) return nullptr;
      FileDescriptorProto proto;
      file->CopyTo(&proto);
      for (auto& message : *proto.mutable_message_type()) StringsToBytes(&message);
      if (pool_.BuildFile(proto) == nullptr) return nullptr;
    }
    const Descriptor* twin = pool_.FindMessageTypeByName(real->full_name());
    if (twin == nullptr) return nullptr;
    return std::unique_ptr<Message>(factory_.GetPrototype(twin)->New());
  }

 private:
  std::mutex mu_;
  google::protobuf::DescriptorPool pool_;
  google::protobuf::DynamicMessageFactory factory_{&pool_};
};

std::optional<std::string> CheckString(const std::string& value, const std::string& path) {
  const size_t bad = FindInvalidUtf8(value);
  if (bad == std::string::npos) return std::nullopt;
  return absl::StrCat(path, ": invalid UTF-8 at byte ", bad,
                      " (string fields must be UTF-8; send other bytes as token ids)");
}

// The first string field of `twin` (laid out as `real`) that is not UTF-8, as "a.b[2]: ...".
std::optional<std::string> FindInvalidString(const Message& twin, const Descriptor* real,
                                             const std::string& prefix) {
  const Reflection* r = twin.GetReflection();
  for (int i = 0; i < real->field_count(); ++i) {
    const FieldDescriptor* f = real->field(i);
    const FieldDescriptor* tf = twin.GetDescriptor()->FindFieldByNumber(f->number());
    const std::string path = prefix + f->name();
    if (f->type() == FieldDescriptor::TYPE_STRING) {
      if (!f->is_repeated()) {
        if (auto bad = CheckString(r->GetString(twin, tf), path)) return bad;
        continue;
      }
      for (int j = 0; j < r->FieldSize(twin, tf); ++j) {
        if (auto bad =
                CheckString(r->GetRepeatedString(twin, tf, j), absl::StrCat(path, "[", j, "]"))) {
          return bad;
        }
      }
    } else if (f->type() == FieldDescriptor::TYPE_MESSAGE && !f->is_map()) {
      if (!f->is_repeated()) {
        if (!r->HasField(twin, tf)) continue;
        if (auto bad = FindInvalidString(r->GetMessage(twin, tf), f->message_type(), path + ".")) {
          return bad;
        }
        continue;
      }
      for (int j = 0; j < r->FieldSize(twin, tf); ++j) {
        if (auto bad = FindInvalidString(r->GetRepeatedMessage(twin, tf, j), f->message_type(),
                                         absl::StrCat(path, "[", j, "]."))) {
          return bad;
        }
      }
    }
  }
  return std::nullopt;
}

void LogProtobufLine(google::protobuf::LogLevel level, const char* file, int line,
                     const std::string& message) {
  const LogLevel ours =
      level >= google::protobuf::LOGLEVEL_FATAL ? LogLevel::kError : LogLevel::kDebug;
  Log(ours, "protobuf", {{"file", file}, {"line", line}, {"message", message}});
}

}  // namespace

absl::Status ParseRequest(const grpc::ByteBuffer& bytes, Message* out) {
  std::vector<grpc::Slice> slices;
  if (!bytes.Dump(&slices).ok()) return absl::InternalError("cannot read the request bytes");
  std::string wire;
  wire.reserve(bytes.Length());
  for (const grpc::Slice& s : slices) {
    wire.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  if (out->ParseFromString(wire)) return absl::OkStatus();
  const std::string type = out->GetDescriptor()->name();
  std::unique_ptr<Message> twin = LenientTwins::Get().New(out->GetDescriptor());
  if (twin != nullptr && twin->ParseFromString(wire)) {
    if (auto bad = FindInvalidString(*twin, out->GetDescriptor(), "")) {
      return absl::InvalidArgumentError(*bad);
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("the request is not a valid ", type, " protobuf message"));
}

absl::Status SerializeResponse(const Message& message, grpc::ByteBuffer* out) {
  std::string wire;
  if (!message.SerializeToString(&wire)) {
    return absl::InternalError(
        absl::StrCat("cannot serialize a ", message.GetDescriptor()->name()));
  }
  grpc::Slice slice(std::move(wire));
  *out = grpc::ByteBuffer(&slice, 1);
  return absl::OkStatus();
}

void RouteProtobufLogs() {
  static std::once_flag once;
  std::call_once(once, [] { google::protobuf::SetLogHandler(&LogProtobufLine); });
}

}  // namespace specula
