// The web page tessera serve shows at / (static HTML and JS, embedded).
#pragma once

namespace httplib {
class Server;
}

namespace tessera::cli {

void register_web_page(httplib::Server& http);

}  // namespace tessera::cli
