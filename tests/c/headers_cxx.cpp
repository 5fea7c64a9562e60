// The public headers compile as C++ and link from C++.
#include "ctorch/ctorch.h"

int main()
{
    ct_memory_stats_t s;
    ct_memory_stats(&s);
    return ct_status_name(CT_OK)[0] == 'C' ? 0 : 1;
}
