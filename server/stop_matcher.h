// File: server/stop_matcher.h
//
// Stop strings over streamed text: text pieces go in, the part that is certainly not
// (the start of) a stop string comes out, and a match ends the stream with the text
// before the stop string. A stop string split across tokens ("<|e" + "nd|>") is found,
// and text that might still turn into one is held back, never emitted then retracted.
//
//   StopMatcher m({"\n\n", "END"});
//   auto r = m.Push("Hello EN");   // r.text == "Hello ", r.stopped == false
//   r = m.Push("D more");          // r.text == "", r.stopped == true
#ifndef RINGSERVE_SERVER_STOP_MATCHER_H_
#define RINGSERVE_SERVER_STOP_MATCHER_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace ring {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  struct Result {
    std::string text;      // safe to emit
    bool stopped = false;  // a stop string matched; nothing after it is emitted
  };
  Result Push(absl::string_view piece);
  // End of generation without a match: releases the held-back text.
  std::string Flush();

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace ring

#endif  // RINGSERVE_SERVER_STOP_MATCHER_H_
