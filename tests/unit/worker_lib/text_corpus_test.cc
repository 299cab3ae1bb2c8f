#include "worker_lib/data/text_corpus.h"

#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace meshrun::worker::parallel {
namespace {

CorpusOptions Options(double validation_fraction, int vocab_multiple = 8) {
  CorpusOptions options;
  options.validation_fraction = validation_fraction;
  options.vocab_multiple = vocab_multiple;
  return options;
}

TEST(TextCorpusTest, VocabularyIsTheDistinctBytesPaddedAndRoundTrips) {
  auto corpus = TextCorpus::FromText("hello world, hello corpus", Options(0.2)).value();
  // h e l o ' ' w r d , c p u s: 13 distinct, padded to 16.
  EXPECT_EQ(corpus.vocab_size(), 16);
  EXPECT_EQ(corpus.Decode(corpus.Encode("hello")), "hello");
  EXPECT_EQ(corpus.Encode("hZz"), corpus.Encode("h"));  // unknown bytes dropped
  EXPECT_EQ(corpus.Decode({15}), "?");                  // padding id
  // Ids follow byte order, so the same text always gets the same ids.
  EXPECT_EQ(corpus.Encode(" "), std::vector<int64_t>{0});   // the smallest byte
  EXPECT_EQ(corpus.Encode("w"), std::vector<int64_t>{12});  // the largest
}

TEST(TextCorpusTest, TheTailIsHeldOutForValidation) {
  auto corpus =
      TextCorpus::FromText(std::string(90, 'a') + std::string(10, 'b'), Options(0.1))
          .value();
  EXPECT_EQ(corpus.size(Split::kTrain), 90);
  EXPECT_EQ(corpus.size(Split::kValidation), 10);
  TokenWindows train = corpus.Windows(Split::kTrain, 1, 0, 16, 8);
  TokenWindows validation = corpus.Windows(Split::kValidation, 1, 0, 16, 8);
  const int64_t a = corpus.Encode("a")[0], b = corpus.Encode("b")[0];
  for (int64_t id : train.tokens) EXPECT_EQ(id, a);
  for (int64_t id : validation.tokens) EXPECT_EQ(id, b);
}

TEST(TextCorpusTest, WindowsDependOnlyOnSeedStepAndSplitAndTargetsAreTheNextTokens) {
  std::string text;
  for (int i = 0; i < 500; ++i) text.push_back(static_cast<char>('a' + (i * 7) % 26));
  auto corpus = TextCorpus::FromText(text, Options(0.1)).value();
  TokenWindows w = corpus.Windows(Split::kTrain, 3, 41, 4, 16);
  ASSERT_EQ(w.tokens.size(), 64u);
  ASSERT_EQ(w.targets.size(), 64u);
  for (int64_t row = 0; row < 4; ++row)
    for (int64_t t = 0; t + 1 < 16; ++t)
      EXPECT_EQ(w.targets[row * 16 + t], w.tokens[row * 16 + t + 1]);
  // Same inputs, same windows (a resumed run sees the same batches); another
  // step or seed, other windows.
  EXPECT_EQ(corpus.Windows(Split::kTrain, 3, 41, 4, 16).tokens, w.tokens);
  EXPECT_NE(corpus.Windows(Split::kTrain, 3, 42, 4, 16).tokens, w.tokens);
  EXPECT_NE(corpus.Windows(Split::kTrain, 4, 41, 4, 16).tokens, w.tokens);
}

TEST(TextCorpusTest, TextsTooShortOrBadFractionsAreRefused) {
  EXPECT_EQ(TextCorpus::FromText("abc", Options(0.5)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TextCorpus::FromText("abcdefgh", Options(0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TextCorpus::FromText("abcdefgh", Options(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TextCorpusTest, CookieSeparatorsBecomeBlankLines) {
  EXPECT_EQ(StripCookieSeparators("one\n%\ntwo\n%\n"), "one\n\ntwo\n\n");
  EXPECT_EQ(StripCookieSeparators("100%\n% off\n"), "100%\n% off\n");
  EXPECT_EQ(StripCookieSeparators("%"), "");
}

TEST(TextCorpusTest, ReadFortunesTakesTheCookieFilesNotIndexesOrLinks) {
  testing::TempDir dir;
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir.path() + "/" + name) << text;
  };
  write("b-cookies", "second\n%\n");
  write("a-cookies", "first\n%\n");
  write("a-cookies.dat", "binary index");
  std::filesystem::create_symlink(dir.path() + "/a-cookies",
                                  dir.path() + "/a-cookies.u8");
  EXPECT_EQ(ReadFortunes(dir.path()).value(), "first\n\nsecond\n\n");
  testing::TempDir empty;
  EXPECT_EQ(ReadFortunes(empty.path()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReadFortunes(empty.path() + "/missing").status().code(),
            absl::StatusCode::kNotFound);
  auto files = TextCorpus::FromFiles({dir.path() + "/a-cookies", dir.path() + "/none"},
                                     Options(0.5));
  EXPECT_EQ(files.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace meshrun::worker::parallel
