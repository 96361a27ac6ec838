#include "tokenizers/unigram_model.h"

#include <algorithm>
#include <limits>

#include "runtime/error.h"

namespace tessera::tokenizers {

namespace {
constexpr double kUnkPenalty = 10.0;

size_t utf8_len(unsigned char b) {
  return b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
}
}  // namespace

UnigramModel::UnigramModel(const std::vector<std::pair<std::string, double>>& vocab, int64_t unk_id)
    : unk_id_(unk_id) {
  TESSERA_CHECK(!vocab.empty(), "[unigram] empty vocabulary, expected (piece, score) pairs");
  TESSERA_CHECK(unk_id < int64_t(vocab.size()), "[unigram] unk_id ", unk_id,
                " is outside the vocabulary of ", vocab.size());
  scores_.reserve(vocab.size());
  ids_.reserve(vocab.size());
  min_score_ = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < vocab.size(); ++i) {
    ids_[vocab[i].first] = int64_t(i);  // a repeated piece keeps the last id, as tokenizers
    scores_.push_back(vocab[i].second);
    min_score_ = std::min(min_score_, vocab[i].second);
    max_piece_bytes_ = std::max(max_piece_bytes_, vocab[i].first.size());
  }
}

int64_t UnigramModel::token_id(const std::string& piece) const {
  auto it = ids_.find(piece);
  return it == ids_.end() ? -1 : it->second;
}

void UnigramModel::encode(std::string_view s, std::vector<int64_t>& out) const {
  if (s.empty()) return;
  struct Node {
    int64_t id = -1;
    double score = 0;
    size_t start = std::string_view::npos;  // npos: not reached yet
  };
  const double unk_score = min_score_ - kUnkPenalty;
  std::vector<Node> best(s.size() + 1);
  best[0].start = 0;
  std::string key;
  for (size_t start = 0; start < s.size();) {
    const double here = best[start].score;
    const size_t char_len = std::min(utf8_len(uint8_t(s[start])), s.size() - start);
    bool single_char = false;
    // Every vocabulary piece that is a prefix of s[start..] (tokenizers' trie search).
    const size_t longest = std::min(max_piece_bytes_, s.size() - start);
    for (size_t len = 1; len <= longest; ++len) {
      key.assign(s.substr(start, len));
      auto it = ids_.find(key);
      if (it == ids_.end()) continue;
      Node& target = best[start + len];
      double cand = here + scores_[size_t(it->second)];
      if (target.start == std::string_view::npos || cand > target.score) {
        target = Node{it->second, cand, start};
      }
      single_char |= len == char_len;
    }
    if (!single_char) {
      TESSERA_CHECK(unk_id_ >= 0, "[unigram] '", std::string(s.substr(start, char_len)),
                    "' is not in the vocabulary and the model has no unk_id");
      Node& target = best[start + char_len];
      double cand = here + unk_score;
      if (target.start == std::string_view::npos || cand > target.score)
        target = Node{unk_id_, cand, start};
    }
    start += char_len;
  }
  // Back-track; runs of unk nodes fuse into one piece (never in the vocabulary, so unk).
  std::vector<std::string_view> pieces;
  size_t fused_start = std::string_view::npos, fused_end = 0;
  for (size_t end = s.size(); end > 0;) {
    const Node& n = best[end];
    if (n.id == unk_id_) {
      if (fused_start == std::string_view::npos) fused_end = end;
      fused_start = n.start;
    } else {
      if (fused_start != std::string_view::npos) {
        pieces.push_back(s.substr(fused_start, fused_end - fused_start));
        fused_start = std::string_view::npos;
      }
      pieces.push_back(s.substr(n.start, end - n.start));
    }
    end = n.start;
  }
  if (fused_start != std::string_view::npos)
    pieces.push_back(s.substr(fused_start, fused_end - fused_start));
  for (auto it = pieces.rbegin(); it != pieces.rend(); ++it) {
    int64_t id = token_id(std::string(*it));
    out.push_back(id >= 0 ? id : unk_id_);
  }
}

}  // namespace tessera::tokenizers
