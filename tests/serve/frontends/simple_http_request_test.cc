#include "serve/frontends/simple_http_request.h"

#include <random>
#include <string>
#include <vector>

#include <boost/asio/buffer.hpp>
#include <gtest/gtest.h>

#include "serve/frontends/http_request_reader.h"

namespace shoal::serve {
namespace {

namespace http = boost::beast::http;

// What Beast's parser, set up as the server sets it up, makes of `bytes`.
struct BeastResult {
  bool done = false;  // a whole request was parsed without error
  RequestHead head;
  bool keep_alive = false;
  size_t used = 0;
};

BeastResult ParseWithBeast(std::string_view bytes) {
  BeastResult result;
  RequestReader parser(&result.head);
  parser.header_limit(64 * 1024);
  parser.body_limit(1 << 20);
  boost::beast::error_code ec;
  while (!parser.is_done() && result.used < bytes.size()) {
    size_t n = parser.put(
        boost::asio::const_buffer(bytes.data() + result.used, bytes.size() - result.used), ec);
    result.used += n;
    if (ec || n == 0) break;
  }
  result.done = !ec && parser.is_done();
  if (result.done) result.keep_alive = parser.keep_alive();
  return result;
}

// Holds ParseSimpleRequestHead to its contract on `bytes`: if it accepts them, Beast accepts
// them too and reads the same request from them. Returns whether it accepted them.
bool AgreesWithBeast(const std::string& bytes) {
  std::optional<SimpleRequestHead> simple = ParseSimpleRequestHead(bytes);
  if (!simple) return false;
  size_t whole = simple->header_size + simple->content_length;
  if (whole > bytes.size()) {
    // The body is not all there: the server leaves such a request to Beast. The header alone
    // must still be one Beast reads the same way, so parse it with its body made whole.
    std::string completed = bytes + std::string(whole - bytes.size(), 'b');
    return AgreesWithBeast(completed);
  }
  BeastResult beast = ParseWithBeast(bytes);
  EXPECT_TRUE(beast.done) << "Beast refuses what the simple parser took:\n" << bytes;
  if (!beast.done) return true;
  EXPECT_EQ(beast.head.method, simple->method) << bytes;
  EXPECT_EQ(beast.head.target, simple->target) << bytes;
  EXPECT_EQ(beast.head.authorization, simple->authorization) << bytes;
  EXPECT_EQ(beast.head.inference_header_content_length, simple->inference_header_content_length)
      << bytes;
  EXPECT_FALSE(beast.head.expect.has_value()) << bytes;
  EXPECT_EQ(beast.head.body, bytes.substr(simple->header_size, simple->content_length)) << bytes;
  EXPECT_EQ(beast.keep_alive, simple->keep_alive) << bytes;
  EXPECT_EQ(beast.used, whole) << bytes;
  return true;
}

TEST(SimpleHttpRequestTest, ReadsTheFormClientsSend) {
  const std::string body = R"({"inputs": []})";
  std::string bytes =
      "POST /v2/models/identity/infer HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"
      "Content-Type: application/json\r\nContent-Length: " +
      std::to_string(body.size()) +
      "\r\nConnection: keep-alive\r\nauthorization:  Bearer t0ken \t\r\n"
      "Inference-Header-Content-Length: 14\r\nAuthorization: Bearer second\r\n\r\n" + body +
      "GET /next";
  std::optional<SimpleRequestHead> head = ParseSimpleRequestHead(bytes);
  ASSERT_TRUE(head.has_value());
  EXPECT_EQ(head->method, "POST");
  EXPECT_EQ(head->target, "/v2/models/identity/infer");
  EXPECT_EQ(head->authorization, "Bearer t0ken");
  EXPECT_EQ(head->inference_header_content_length, "14");
  EXPECT_EQ(head->content_length, body.size());
  EXPECT_TRUE(head->keep_alive);
  EXPECT_EQ(bytes.substr(head->header_size, head->content_length), body);
  EXPECT_TRUE(AgreesWithBeast(bytes.substr(0, head->header_size + head->content_length)));

  // curl's, and a request without a body.
  for (std::string request :
       {std::string("GET /v2/health/ready?verbose=1 HTTP/1.1\r\nHost: localhost:8000\r\n"
                    "User-Agent: curl/7.88.1\r\nAccept: */*\r\n\r\n"),
        std::string("GET / HTTP/1.1\r\n\r\n"),
        std::string("DELETE /x HTTP/1.1\r\nCONNECTION: Close\r\ncontent-length: 0\r\n\r\n")}) {
    EXPECT_TRUE(AgreesWithBeast(request)) << request;
  }
  EXPECT_FALSE(ParseSimpleRequestHead("DELETE /x HTTP/1.1\r\nConnection: close\r\n\r\n")
                   ->keep_alive);
}

TEST(SimpleHttpRequestTest, LeavesEverythingElseToBeast) {
  const std::string ok = "POST /infer HTTP/1.1\r\nHost: h\r\n";
  for (std::string request : {
           std::string("POST /infer HTTP/1.1\r\nHost: h\r\n"),         // incomplete
           std::string("POST /infer HTTP/1.1\r\nHost: h\r\n\r"),       // incomplete
           std::string("POST /infer HTTP/1.0\r\nHost: h\r\n\r\n"),     // keep-alive differs
           std::string("post /infer HTTP/1.1\r\n\r\n"),                // a method Beast allows
           std::string("\r\nPOST /infer HTTP/1.1\r\n\r\n"),            // a leading empty line
           std::string("POST /in fer HTTP/1.1\r\n\r\n"),
           std::string("POST /infer\xc3\xa9 HTTP/1.1\r\n\r\n"),        // non-ASCII target
           std::string("POST  /infer HTTP/1.1\r\n\r\n"),
           std::string("POST /infer HTTP/1.1\n\n"),                    // bare LF
           ok + "X: a\rb\r\n\r\n",                                      // bare CR
           ok + "X: caf\xc3\xa9\r\n\r\n",                               // obs-text
           ok + "X: a\x01z\r\n\r\n",                                    // a control byte
           ok + "X: a\r\n folded\r\n\r\n",                              // obs-fold
           ok + "X : a\r\n\r\n",                                        // a blank before ':'
           ok + "X\r\n\r\n",                                            // no ':'
           ok + "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
           ok + "Expect: 100-continue\r\nContent-Length: 2\r\n\r\nab",
           ok + "Upgrade: websocket\r\n\r\n",
           ok + "Proxy-Connection: close\r\n\r\n",
           ok + "Connection: keep-alive, close\r\n\r\n",
           ok + "Connection: upgrade\r\n\r\n",
           ok + "Content-Length: 2\r\nContent-Length: 2\r\n\r\nab",
           ok + "Content-Length: +2\r\n\r\nab",
           ok + "Content-Length: 2,2\r\n\r\nab",
           ok + "Content-Length: \r\n\r\n",
           ok + "Content-Length: 1234567890123456789\r\n\r\n",
           ok + "X: " + std::string(kMaxSimpleHeaderBytes, 'a') + "\r\n\r\n",  // too long
       }) {
    EXPECT_FALSE(ParseSimpleRequestHead(request).has_value()) << request;
  }
}

// Requests built from parts that a client, a proxy or an attacker might send, each one both
// parsers read: whenever the simple parser accepts one, Beast reads it the same way.
TEST(SimpleHttpRequestTest, AgreesWithBeastOnRandomRequests) {
  std::mt19937 random(27);
  auto pick = [&](const std::vector<std::string>& choices) {
    return choices[std::uniform_int_distribution<size_t>(0, choices.size() - 1)(random)];
  };
  auto chance = [&](double p) { return std::bernoulli_distribution(p)(random); };
  auto recase = [&](std::string s) {
    for (char& c : s) {
      if (chance(0.3)) c = static_cast<char>(chance(0.5) ? std::toupper(c) : std::tolower(c));
    }
    return s;
  };
  // Each part is a usual one mostly, and now and then one of the odd ones.
  auto part = [&](const std::vector<std::string>& usual, const std::vector<std::string>& odd) {
    return chance(0.9) ? pick(usual) : pick(odd);
  };
  const std::vector<std::string> methods = {"POST", "GET", "PUT"};
  const std::vector<std::string> odd_methods = {"get", "P0ST", "", "POST ", "PO\x80ST"};
  const std::vector<std::string> targets = {"/v2/models/m/infer", "/v2/health/ready?x=1",
                                            "/a%20b", "*"};
  const std::vector<std::string> odd_targets = {"/caf\xc3\xa9", "/a b", "", "/\x01",
                                                "/v2/models/\x7f/infer", "/v2/mo\tdels/m/infer",
                                                "/v2/models/m/inf\xe9r"};
  const std::vector<std::string> versions = {"HTTP/1.1"};
  const std::vector<std::string> odd_versions = {"HTTP/1.0", "HTTP/2", "http/1.1", "HTTP/1.1 "};
  const std::vector<std::string> names = {
      "Host", "Content-Type", "Content-Length", "Connection", "Authorization",
      "Inference-Header-Content-Length", "Accept", "X-Odd"};
  const std::vector<std::string> odd_names = {
      "Transfer-Encoding", "Expect", "Upgrade", "Proxy-Connection", "Bad Name", "",
      "Content-Length ", "X\x80"};
  const std::vector<std::string> values = {
      "", "0", "5", "05", "keep-alive", "close", "Keep-Alive", "Bearer t", "Bearer  t\t",
      "a\tb", "x, y", "\"q\""};
  const std::vector<std::string> odd_values = {
      "2,2", "+5", " 5", "5 ", "99999999999999999999", "keep-alive, close", "upgrade",
      "chunked", "100-continue", "caf\xc3\xa9", "a\x01", "a\x7f", "a\rb",
      // Long ones, read eight bytes at a time, with an odd byte at every offset in a word.
      "0123456789abcdefghijklmnop", "0123456789abc\x01" "efghijklmnop", "0123456789abcdefg\x7fijk",
      "0123\x80\x80\x80\x80\x80" "456789abcdef", "\t\t0123456789\tabcdefgh\t \t",
      "abcdefg\x1fhijklmnop", "abcdefgh\xffijklmno", "a b c d e f g h i j k l m n o p\x0b"};
  const std::vector<std::string> line_ends = {"\r\n"};
  const std::vector<std::string> odd_line_ends = {"\n", "\r", "\r\n ", "\n\r"};
  int accepted = 0;
  const int kRequests = 20000;
  for (int i = 0; i < kRequests; ++i) {
    std::string request = part(methods, odd_methods) + " " + part(targets, odd_targets) + " " +
                          part(versions, odd_versions) + "\r\n";
    int fields = std::uniform_int_distribution<int>(0, 6)(random);
    for (int f = 0; f < fields; ++f) {
      if (chance(0.03)) request += " folded";
      request += recase(part(names, odd_names)) + ":" +
                 (chance(0.7) ? " " : chance(0.5) ? "\t " : "") + part(values, odd_values) +
                 (chance(0.2) ? " " : "") + part(line_ends, odd_line_ends);
    }
    request += "\r\n";
    request += std::string(std::uniform_int_distribution<int>(0, 8)(random), 'b');
    if (chance(0.1)) request.resize(std::uniform_int_distribution<size_t>(0, request.size())(random));
    if (AgreesWithBeast(request)) ++accepted;
    if (::testing::Test::HasFailure()) break;
  }
  // Enough of them are simple for the comparison to mean something.
  EXPECT_GT(accepted, kRequests / 8);
}

}  // namespace
}  // namespace shoal::serve
