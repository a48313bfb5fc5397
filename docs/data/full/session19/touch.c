#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int c,char**v){size_t n=(size_t)1<<30; int huge=atoi(v[1]);
for(int r=0;r<3;r++){char*p=mmap(0,n,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
if(huge)madvise(p,n,MADV_HUGEPAGE); else madvise(p,n,MADV_NOHUGEPAGE);
double t=now(); for(size_t i=0;i<n;i+=4096)p[i]=1; double t2=now();
memset(p,2,n); double t3=now();
printf("huge=%d first touch %.1f ms (%.2f GB/s), memset after %.1f ms\n",huge,(t2-t)*1e3,1/(t2-t),(t3-t2)*1e3);
munmap(p,n);}}
