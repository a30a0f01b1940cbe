#include "model/io/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <stdexcept>
#include <utility>


#include <nlohmann/json.hpp>

#include "model/io/atomic_file.h"
#include "kernels/common/error.h"
#include "model/io/mapped_file.h"

namespace quest {

namespace {

using ordered_json = nlohmann::ordered_json;

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

// Product of the dims in uint64, false on overflow. A zero dim makes the product 0 whatever the other dims are, so
// it is checked first: [2^62, 2^62, 0] is a valid (empty) shape although its prefix products overflow.
bool checked_numel(std::span<const int64_t> shape, uint64_t& out) {
    out = 1;
    for (int64_t d : shape)
        if (d == 0) {
            out = 0;
            return true;
        }
    for (int64_t d : shape) {
        if (d < 0) return false;
        if (__builtin_mul_overflow(out, static_cast<uint64_t>(d), &out)) return false;
    }
    return true;
}

// Byte size of a tensor of `shape` and `dtype`, false on overflow (or when numel does not fit int64).
bool checked_nbytes(std::span<const int64_t> shape, DType dtype, uint64_t& out) {
    uint64_t n = 0;
    if (!checked_numel(shape, n) || n > uint64_t(std::numeric_limits<int64_t>::max())) return false;
    return !__builtin_mul_overflow(n, uint64_t(dtype_size(dtype)), &out);
}

std::string errno_text(int err) { return std::strerror(err); }

// Parses JSON text, rejecting duplicate keys in any object (nlohmann would silently keep the last one, which would
// hide e.g. a tensor listed twice). nlohmann's exceptions become InputError naming `what` (the file).
ordered_json parse_json(std::string_view text, const std::string& what, const char* role) {
    std::vector<std::set<std::string>> keys;  // one set per open object
    auto callback = [&](int /*depth*/, ordered_json::parse_event_t event, ordered_json& parsed) {
        switch (event) {
            case ordered_json::parse_event_t::object_start:
                keys.emplace_back();
                break;
            case ordered_json::parse_event_t::object_end:
                if (!keys.empty()) keys.pop_back();
                break;
            case ordered_json::parse_event_t::key:
                if (!keys.empty() && !keys.back().insert(parsed.get<std::string>()).second)
                    throw InputError(what + ": " + role + " has the key '" + parsed.get<std::string>() + "' twice");
                break;
            default:
                break;
        }
        return true;
    };
    try {
        return ordered_json::parse(text.begin(), text.end(), callback);
    } catch (const nlohmann::json::exception& e) {
        throw InputError(what + ": " + role + " is not valid JSON: " + e.what());
    }
}

std::string dump_short(const ordered_json& j) {
    std::string s = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    if (s.size() > 60) s = s.substr(0, 57) + "...";
    return s;
}

// Reads a non-negative JSON integer that fits int64; false otherwise (negative, float, string, too large, ...).
bool json_to_nonneg(const ordered_json& j, int64_t& out) {
    if (j.is_number_unsigned()) {
        const auto v = j.get<uint64_t>();
        if (v > uint64_t(std::numeric_limits<int64_t>::max())) return false;
        out = int64_t(v);
        return true;
    }
    if (j.is_number_integer()) {
        out = j.get<int64_t>();
        return out >= 0;
    }
    return false;
}

// Parses one tensor entry of the header; `at` is the "<file>: tensor 'name'" prefix of every message.
TensorInfo parse_tensor(const std::string& name, const ordered_json& entry, uint64_t data_size,
                        const std::string& at) {
    if (!entry.is_object()) throw InputError(at + ": entry is not a JSON object: " + dump_short(entry));
    TensorInfo t;
    t.name = name;

    const auto dt = entry.find("dtype");
    if (dt == entry.end()) throw InputError(at + ": missing field 'dtype'");
    if (!dt->is_string()) throw InputError(at + ": field 'dtype' is not a string: " + dump_short(*dt));
    if (!dtype_from_name(dt->get_ref<const std::string&>(), t.dtype))
        throw InputError(at + ": unknown dtype '" + dt->get<std::string>() + "'");

    const auto sh = entry.find("shape");
    if (sh == entry.end()) throw InputError(at + ": missing field 'shape'");
    if (!sh->is_array()) throw InputError(at + ": field 'shape' is not an array: " + dump_short(*sh));
    for (size_t i = 0; i < sh->size(); ++i) {
        const auto& d = (*sh)[i];
        int64_t v = 0;
        if (d.is_number_integer() && !d.is_number_unsigned() && d.get<int64_t>() < 0)
            throw InputError(at + ": negative shape dimension " + d.dump() + " at index " + std::to_string(i));
        if (!json_to_nonneg(d, v))
            throw InputError(at + ": shape dimension " + std::to_string(i) +
                             " is not a non-negative 64-bit integer: " + dump_short(d));
        t.shape.push_back(v);
    }

    const auto off = entry.find("data_offsets");
    if (off == entry.end()) throw InputError(at + ": missing field 'data_offsets'");
    int64_t begin = 0, end = 0;
    if (!off->is_array() || off->size() != 2 || !json_to_nonneg((*off)[0], begin) ||
        !json_to_nonneg((*off)[1], end))
        throw InputError(at + ": field 'data_offsets' is not two non-negative integers [begin, end]: " +
                         dump_short(*off));
    t.begin = uint64_t(begin);
    t.end = uint64_t(end);
    const std::string offsets = "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "]";
    if (t.begin > t.end) throw InputError(at + ": " + offsets + " has begin > end");
    if (t.end > data_size)
        throw InputError(at + ": " + offsets + " end lies beyond the data area of " + std::to_string(data_size) +
                         " bytes (file truncated?)");

    uint64_t want = 0;
    if (!checked_nbytes(t.shape, t.dtype, want))
        throw InputError(at + ": shape " + shape_to_string(t.shape) + " has too many elements (overflow)");
    if (want != t.nbytes())
        throw InputError(at + ": shape " + shape_to_string(t.shape) + " x " + std::string(dtype_name(t.dtype)) +
                         " (" + std::to_string(dtype_size(t.dtype)) + " bytes) needs " + std::to_string(want) +
                         " bytes but data_offsets span " + std::to_string(t.nbytes()) + " bytes");
    return t;
}

std::string read_text_file(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw InputError(path.string() + ": cannot open: " + errno_text(errno));
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) throw InputError(path.string() + ": read error");
    return ss.str();
}

// A shard name from the index must be a plain file name inside the model folder.
bool is_plain_file_name(const std::string& s) {
    return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos &&
           s.find('\\') == std::string::npos && s.find('\0') == std::string::npos;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------------
// TensorInfo
// ---------------------------------------------------------------------------------------------------------------------

int64_t TensorInfo::numel() const {
    uint64_t n = 0;
    if (!checked_numel(shape, n) || n > uint64_t(std::numeric_limits<int64_t>::max()))
        throw std::overflow_error("tensor '" + name + "': shape " + shape_to_string(shape) +
                                  " has no representable element count");
    return int64_t(n);
}

std::string shape_to_string(std::span<const int64_t> shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) {
        if (i) s += ", ";
        s += std::to_string(shape[i]);
    }
    return s + "]";
}

// ---------------------------------------------------------------------------------------------------------------------
// SafeTensorsFile
// ---------------------------------------------------------------------------------------------------------------------

std::unique_ptr<SafeTensorsFile> SafeTensorsFile::open(const std::filesystem::path& path) {
    const std::string file = path.string();
    std::unique_ptr<SafeTensorsFile> f(new SafeTensorsFile());
    f->path_ = path;

    f->map_.reset(map_file(path, ""));  // from here on `f` unmaps it on every error path
    const uint64_t size = f->map_.size();
    const auto* bytes = static_cast<const unsigned char*>(f->map_.data());

    if (size < 8)
        throw InputError(file + ": file is " + std::to_string(size) +
                         " bytes, too short to hold the 8-byte header length");
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];  // little-endian on any host
    if (header_len > size - 8)
        throw InputError(file + ": header length " + std::to_string(header_len) +
                         " extends past the end of the file (" + std::to_string(size) + " bytes)");
    const uint64_t data_size = size - 8 - header_len;
    f->data_ = reinterpret_cast<const std::byte*>(bytes + 8 + header_len);

    const std::string_view text(reinterpret_cast<const char*>(bytes + 8), size_t(header_len));
    const ordered_json header = parse_json(text, file, "header");
    if (!header.is_object()) throw InputError(file + ": header is not a JSON object: " + dump_short(header));

    for (const auto& [name, entry] : header.items()) {
        if (name == "__metadata__") {
            if (!entry.is_object())
                throw InputError(file + ": __metadata__ is not a JSON object: " + dump_short(entry));
            for (const auto& [key, value] : entry.items()) {
                if (!value.is_string())
                    throw InputError(file + ": __metadata__ value for '" + key + "' is not a string: " +
                                     dump_short(value));
                f->metadata_[key] = value.get<std::string>();
            }
            continue;
        }
        if (name.empty()) throw InputError(file + ": header has a tensor with an empty name");
        f->tensors_.push_back(parse_tensor(name, entry, data_size, file + ": tensor '" + name + "'"));
        f->by_name_[name] = f->tensors_.size() - 1;  // names are unique: parse_json rejects duplicate keys
    }

    // Overlaps: sorted by begin, a tensor overlaps an earlier one iff it starts before the previous one ends (as long
    // as no overlap has been found yet, the earlier ranges are disjoint and the previous one ends last). Empty
    // tensors hold no bytes and cannot overlap anything.
    std::vector<const TensorInfo*> order;
    for (const auto& t : f->tensors_)
        if (t.nbytes() > 0) order.push_back(&t);
    std::sort(order.begin(), order.end(), [](const TensorInfo* a, const TensorInfo* b) {
        return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
    });
    for (size_t i = 1; i < order.size(); ++i) {
        const TensorInfo& prev = *order[i - 1];
        const TensorInfo& cur = *order[i];
        if (cur.begin < prev.end)
            throw InputError(file + ": tensor '" + cur.name + "': data_offsets [" + std::to_string(cur.begin) +
                             ", " + std::to_string(cur.end) + "] overlap those of tensor '" + prev.name + "' [" +
                             std::to_string(prev.begin) + ", " + std::to_string(prev.end) + "]");
    }
    return f;
}

const TensorInfo* SafeTensorsFile::find(const std::string& name) const {
    const auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

// ---------------------------------------------------------------------------------------------------------------------
// ModelFiles
// ---------------------------------------------------------------------------------------------------------------------

ModelFiles::ModelFiles(const std::filesystem::path& dir) : dir_(dir) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (!fs::exists(dir, ec)) throw InputError("model folder " + dir.string() + " does not exist");
    if (!fs::is_directory(dir, ec)) throw InputError("model folder " + dir.string() + " is not a folder");

    const fs::path index_path = dir / kIndexName;
    const fs::path single_path = dir / kSingleName;
    if (fs::exists(index_path, ec)) {
        const std::string index_file = index_path.string();
        const ordered_json index = parse_json(read_text_file(index_path), index_file, "index");
        if (!index.is_object()) throw InputError(index_file + ": index is not a JSON object");
        const auto wm = index.find("weight_map");
        if (wm == index.end()) throw InputError(index_file + ": missing field 'weight_map'");
        if (!wm->is_object()) throw InputError(index_file + ": field 'weight_map' is not a JSON object");
        if (wm->empty()) throw InputError(index_file + ": 'weight_map' lists no tensors");

        // Each shard is opened once, in the order of first mention.
        std::map<std::string, size_t> shard_index;
        std::vector<std::pair<std::string, std::string>> listed;  // tensor, shard
        for (const auto& [tensor, shard_json] : wm->items()) {
            if (!shard_json.is_string())
                throw InputError(index_file + ": weight_map entry for tensor '" + tensor +
                                 "' is not a string: " + dump_short(shard_json));
            const std::string shard = shard_json.get<std::string>();
            if (!is_plain_file_name(shard))
                throw InputError(index_file + ": tensor '" + tensor + "': shard name '" + shard +
                                 "' is not a plain file name inside the model folder");
            listed.emplace_back(tensor, shard);
            if (shard_index.count(shard)) continue;
            const fs::path shard_path = dir / shard;
            if (!fs::exists(shard_path, ec))
                throw InputError(index_file + ": shard " + shard_path.string() + " (listed for tensor '" + tensor +
                                 "') does not exist");
            shard_index[shard] = files_.size();
            files_.push_back(SafeTensorsFile::open(shard_path));
        }
        for (const auto& [tensor, shard] : listed) {
            const SafeTensorsFile& f = *files_[shard_index.at(shard)];
            if (!f.find(tensor))
                throw InputError(f.path().string() + ": tensor '" + tensor + "' listed in " + kIndexName +
                                 " is not in this shard");
        }
    } else if (fs::exists(single_path, ec)) {
        files_.push_back(SafeTensorsFile::open(single_path));
    } else {
        throw InputError("model folder " + dir.string() + " holds neither " + kSingleName + " nor " + kIndexName);
    }

    for (const auto& f : files_)
        for (const auto& t : f->tensors()) {
            const auto [it, inserted] = tensors_.try_emplace(t.name, TensorRef{f.get(), &t});
            if (!inserted)
                throw InputError("model folder " + dir.string() + ": tensor '" + t.name + "' is in two shards: " +
                                 it->second.file->path().filename().string() + " and " +
                                 f->path().filename().string());
        }
}

std::optional<TensorRef> ModelFiles::find(const std::string& name) const {
    const auto it = tensors_.find(name);
    if (it == tensors_.end()) return std::nullopt;
    return it->second;
}

TensorRef ModelFiles::get(const std::string& name, std::span<const int64_t> expected_shape) const {
    const auto it = tensors_.find(name);
    if (it == tensors_.end())
        throw InputError("tensor '" + name + "' not found in " + dir_.string() + " (" +
                         std::to_string(tensors_.size()) + " tensors)");
    const TensorRef& ref = it->second;
    if (!std::equal(expected_shape.begin(), expected_shape.end(), ref.info->shape.begin(), ref.info->shape.end()))
        throw InputError(ref.file->path().string() + ": tensor '" + name + "': shape mismatch: Expected " +
                         shape_to_string(expected_shape) + ", Actual " + shape_to_string(ref.info->shape));
    return ref;
}

std::vector<std::string> ModelFiles::names() const {
    std::vector<std::string> out;
    out.reserve(tensors_.size());
    for (const auto& [name, ref] : tensors_) out.push_back(name);
    return out;
}

// ---------------------------------------------------------------------------------------------------------------------
// Writing
// ---------------------------------------------------------------------------------------------------------------------

void write_safetensors(const std::filesystem::path& path, std::span<const TensorToWrite> tensors,
                       const std::map<std::string, std::string>& metadata) {
    // Validate and build the header first, so that bad arguments never create a file.
    ordered_json header = ordered_json::object();
    if (!metadata.empty()) {
        ordered_json meta = ordered_json::object();
        for (const auto& [k, v] : metadata) meta[k] = v;
        header["__metadata__"] = std::move(meta);
    }
    std::set<std::string> names;
    uint64_t offset = 0;
    for (const auto& t : tensors) {
        const std::string at = "write_safetensors: " + path.string() + ": tensor '" + t.name + "'";
        if (t.name.empty() || t.name == "__metadata__") throw std::invalid_argument(at + ": invalid tensor name");
        if (!names.insert(t.name).second) throw std::invalid_argument(at + ": name given twice");
        for (int64_t d : t.shape)
            if (d < 0) throw std::invalid_argument(at + ": negative dimension in shape " + shape_to_string(t.shape));
        uint64_t want = 0;
        if (!checked_nbytes(t.shape, t.dtype, want))
            throw std::invalid_argument(at + ": shape " + shape_to_string(t.shape) + " has too many elements");
        if (want != t.bytes.size())
            throw std::invalid_argument(at + ": shape " + shape_to_string(t.shape) + " x " +
                                        std::string(dtype_name(t.dtype)) + " needs " + std::to_string(want) +
                                        " bytes, got " + std::to_string(t.bytes.size()));
        header[t.name] = {{"dtype", std::string(dtype_name(t.dtype))},
                          {"shape", t.shape},
                          {"data_offsets", {offset, offset + want}}};
        offset += want;
    }
    std::string text;
    try {
        text = header.dump();
    } catch (const nlohmann::json::exception& e) {  // e.g. a name or metadata string that is not UTF-8
        throw std::invalid_argument("write_safetensors: " + path.string() + ": " + e.what());
    }
    text.append((8 - text.size() % 8) % 8, ' ');  // data area starts 8-byte aligned in the file
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(uint64_t(text.size()) >> (8 * i));

    // An AtomicFile: readers never see a partial file under `path`, and an interrupted or killed writer leaves
    // no temporary behind.
    AtomicFile out(path);
    out.write(len, 8);
    out.write(text);
    for (const auto& t : tensors) out.write(t.bytes.data(), t.bytes.size());
    out.commit();
}

}  // namespace quest
